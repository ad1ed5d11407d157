"""Per-phase extras: each adds its fields to a phase (`results.Phase` inherits them) and says
its lines under the report's tables. The report prints the tables, then, for every phase, the
lines of each extra in this order."""

from __future__ import annotations

from collections.abc import Iterator

from ucmctl.bench.extras import (
    failures,
    fault,
    goodput,
    handover,
    hit_rates,
    lost,
    paths,
    preemptions,
    series,
    store_errors,
    trace_lag,
)
from ucmctl.bench.extras.base import Extra, Fields, Note, PhaseView

EXTRAS: tuple[Extra, ...] = (
    failures.EXTRA,
    preemptions.EXTRA,
    lost.EXTRA,
    handover.EXTRA,
    paths.EXTRA,
    fault.EXTRA,
    store_errors.EXTRA,
    goodput.EXTRA,
    trace_lag.EXTRA,
    hit_rates.EXTRA,
    series.EXTRA,
)


def notes(view: PhaseView) -> Iterator[Note]:
    """A phase's lines under the tables, extra by extra."""
    for extra in EXTRAS:
        yield from extra.lines(view)


__all__ = ["EXTRAS", "Extra", "Fields", "Note", "PhaseView", "notes"]
