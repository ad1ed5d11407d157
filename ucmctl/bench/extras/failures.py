"""The phase's failed requests, by error (the phase's core `errors`)."""

from __future__ import annotations

from collections.abc import Iterator

from ucmctl.bench.extras.base import Extra, Note, PhaseView


def lines(view: PhaseView) -> Iterator[Note]:
    if view.cell.aggregate:  # said per round
        return
    for e in view.phase.errors:
        yield Note(f"{view.name}: {e.count} x {e.error}", style="red")


EXTRA = Extra("failures", lines)
