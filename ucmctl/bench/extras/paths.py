"""The paths PD requests took through the proxy (selective disaggregation), when some went
straight to a decode instance."""

from __future__ import annotations

from collections.abc import Iterator

from ucmctl.bench.extras.base import Extra, Fields, Note, PhaseView


class PathsFields(Fields):
    paths: dict[str, int] | None = None  # requests by path: disaggregated, direct, direct_saturated


def lines(view: PhaseView) -> Iterator[Note]:
    took = view.phase.paths
    if took:
        yield Note(
            f"{view.name}: paths (proxy): {took.get('disaggregated', 0)} prefill then decode, "
            f"{took.get('direct', 0) + took.get('direct_saturated', 0)} whole on one instance (it "
            f"prefilled them itself{_busy(took)})"
        )


def _busy(took: dict[str, int]) -> str:
    busy = took.get("direct_saturated", 0)
    return f"; {busy} of them as every prefill instance was busy" if busy else ""


EXTRA = Extra("paths", lines, PathsFields)
