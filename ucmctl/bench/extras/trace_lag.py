"""How far behind the trace's schedule the requests were sent (the trace workload)."""

from __future__ import annotations

from collections.abc import Iterator

from ucmctl.bench.extras.base import Extra, Fields, Note, PhaseView
from ucmctl.bench.open_model import Open


class Lag(Open):
    """The lateness of the sends, in ms (None when nothing was scheduled)."""

    mean: int | float | None = None
    p50: int | float | None = None
    p99: int | float | None = None
    max: int | float | None = None


class TraceLagFields(Fields):
    send_lag_ms: Lag | None = None


def lines(view: PhaseView) -> Iterator[Note]:
    lag = view.phase.send_lag_ms
    if lag is not None and lag.p99 is not None:
        yield Note(
            f"{view.name}: sends behind the trace's schedule by {lag.p50:.2f} ms p50, "
            f"{lag.p99:.2f} ms p99, {lag.max:.2f} ms max"
        )


EXTRA = Extra("trace lag", lines, TraceLagFields)
