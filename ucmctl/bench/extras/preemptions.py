"""Requests the engine preempted because the KV cache was full (the hit rates' total)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from ucmctl.bench.extras.base import Extra, Note, PhaseView


def preemptions(total: Mapping[str, Any] | None) -> int | None:
    """The preemptions in a phase's total hit-rate counters; None where none were read."""
    value = (total or {}).get("preemptions")
    return None if value is None else int(value)


def lines(view: PhaseView) -> Iterator[Note]:
    hit_rate = view.phase.hit_rate
    preempted = preemptions(hit_rate.total if hit_rate else None)
    if preempted:
        yield Note(
            f"{view.name}: {preempted} preemption(s): the KV cache was full (figures include them)",
            style="yellow",
        )


EXTRA = Extra("preemptions", lines)
