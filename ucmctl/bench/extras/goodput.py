"""Goodput (`--goodput`): the requests that met every SLO, per second."""

from __future__ import annotations

from collections.abc import Iterator

from ucmctl.bench.extras.base import Extra, Fields, Note, PhaseView


class GoodputFields(Fields):
    request_goodput: int | float | None = None  # req/s
    good_completed: int | None = None
    goodput_slos_ms: dict[str, int | float] | None = None  # metric -> bound (ms)


def lines(view: PhaseView) -> Iterator[Note]:
    p = view.phase
    if p.request_goodput is not None:
        slos = ", ".join(f"{k} <= {v:g} ms" for k, v in (p.goodput_slos_ms or {}).items())
        yield Note(
            f"{view.name}: goodput {p.request_goodput:.2f} req/s ({p.good_completed} of "
            f"{p.completed + p.failed} requests met {slos})"
        )


EXTRA = Extra("goodput", lines, GoodputFields)
