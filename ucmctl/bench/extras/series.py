"""The server time series read while the phase ran (`--series`): plotted, not said."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from ucmctl.bench.extras.base import Extra, Fields, Note, PhaseView


class SeriesFields(Fields):
    series: dict[str, Any] | None = None  # `bench/series.py`'s samples, per instance


def lines(view: PhaseView) -> Iterator[Note]:
    return iter(())


EXTRA = Extra("series", lines, SeriesFields)
