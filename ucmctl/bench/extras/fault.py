"""The fault `bench --fault` injected, and what it cost (`bench/fault.py`'s report)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from ucmctl.bench.extras.base import Extra, Fields, Note, PhaseView


class FaultFields(Fields):
    fault: dict[str, Any] | None = None  # what was injected and what it cost


def lines(view: PhaseView) -> Iterator[Note]:
    if view.phase.fault:
        from ucmctl.bench.fault import fault_lines  # its numpy and aiohttp: only when said

        for line in fault_lines(view.name, view.phase.fault):
            yield Note(line)


EXTRA = Extra("fault", lines, FaultFields)
