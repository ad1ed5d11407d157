"""The deployment's processes lost while the phase ran (a run against a deployment)."""

from __future__ import annotations

from collections.abc import Iterator

from ucmctl.bench.extras.base import Extra, Fields, Note, PhaseView
from ucmctl.bench.open_model import Open


class Loss(Open):
    """A process found dead or unhealthy (`deploy.watch.Loss`, as saved)."""

    process: str
    node: str
    how: str
    into_s: int | float  # seconds into the phase


class LostFields(Fields):
    lost: list[Loss] | None = None


def lines(view: PhaseView) -> Iterator[Note]:
    for lost in view.phase.lost or []:
        yield Note(
            f"{view.name}: lost {lost.process} on {lost.node} ({lost.how}, "
            f"{lost.into_s:.0f} s in): figures include the time without it",
            style="red",
        )


EXTRA = Extra("lost", lines, LostFields)
