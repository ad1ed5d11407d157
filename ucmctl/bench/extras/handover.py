"""The KV handover in PD, as the proxy timed it (measure phases)."""

from __future__ import annotations

from collections.abc import Iterator

from ucmctl.bench.extras.base import Extra, Fields, Note, PhaseView
from ucmctl.bench.formats import ms
from ucmctl.bench.open_model import Open


class Handover(Open):
    """`bench/handover.py`'s figures: how many requests streamed, and the time (ms)."""

    count: int = 0
    mean_ms: int | float | None = None
    p50_ms: int | float | None = None
    p99_ms: int | float | None = None


class HandoverFields(Fields):
    kv_handover: Handover | None = None


def lines(view: PhaseView) -> Iterator[Note]:
    handed, p = view.phase.kv_handover, view.phase
    if handed is not None and handed.count and view.key == "measure":
        yield Note(
            f"{view.name}: KV handover (proxy, {handed.count} streamed): mean "
            f"{ms(handed.mean_ms)}, p50 {ms(handed.p50_ms)}, p99 {ms(handed.p99_ms)} "
            f"ms; TTFT mean {ms(p.mean_ttft_ms)} ms"
        )


EXTRA = Extra("handover", lines, HandoverFields)
