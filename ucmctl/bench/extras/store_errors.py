"""What the UCM store failed to load or save in the phase (the hit rates' total)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from ucmctl.bench.extras.base import Extra, Note, PhaseView
from ucmctl.core.store_errors import describe


def store_errors(total: Mapping[str, Any] | None) -> str | None:
    """The store's errors in a phase's total hit-rate counters, by kind, in words; None if
    nothing."""
    # ucm_load_errors_enotconn -> load_enotconn, ucm_load_waits_over_bound -> load_waits_over_bound
    counts = {k[4:].replace("_errors", "", 1): v for k, v in (total or {}).items() if k.startswith("ucm_")}
    return describe(counts, words=True) or None


def lines(view: PhaseView) -> Iterator[Note]:
    hit_rate = view.phase.hit_rate
    storage = store_errors(hit_rate.total if hit_rate else None)
    if storage:
        yield Note(f"{view.name}: UCM store: {storage} (misses are recomputed)", style="yellow")


EXTRA = Extra("store errors", lines)
