"""Sweep points: `--request-rate` and `--concurrency` take comma-separated lists, and the run
measures every (rate, concurrency) pair, rate-major in the order given (like `vllm bench sweep`).
Each point runs the workload with prompts of its own (a later point never hits what an earlier
one cached) and names the point in each cell's label when there is more than one."""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ucmctl.core.errors import UcmctlError

if TYPE_CHECKING:
    from ucmctl.bench.results import Cell
    from ucmctl.bench.runner import BenchConfig, Progress, Target
    from ucmctl.bench.workloads import WorkloadSpec

_RATE_KEY = "--request-rate"
_RATE_FIX = "inf (all at once) or requests/s > 0, comma-separated for a sweep, e.g. 1,2,4,inf"
_CONC_KEY = "--concurrency"
_CONC_FIX = "whole numbers >= 1, comma-separated for a sweep, e.g. 1,2,4,8"


def format_rate(rate: float) -> str:
    """`inf`, `2`, `2.5`, `0.1`: the shortest text that reads back as the same rate."""
    if math.isinf(rate):
        return "inf"
    if rate.is_integer() and abs(rate) < 1e15:
        return str(int(rate))
    return repr(rate)


@dataclass(frozen=True)
class Point:
    """One sweep point: the request rate (math.inf: all at once) and the concurrency cap."""

    request_rate: float
    concurrency: int

    def label(self) -> str:
        """Short and stable, e.g. `rate inf, conc 8` or `rate 2.5/s, conc 8`."""
        rate = "inf" if math.isinf(self.request_rate) else f"{format_rate(self.request_rate)}/s"
        return f"rate {rate}, conc {self.concurrency}"

    def as_dict(self) -> dict[str, Any]:
        """`vllm bench serve`'s key names; an infinite rate is the string "inf", as vLLM writes it."""
        rate: float | str = "inf" if math.isinf(self.request_rate) else self.request_rate
        return {"request_rate": rate, "max_concurrency": self.concurrency}


def _items(text: str, key: str, fix: str) -> list[str]:
    items = [item.strip() for item in text.split(",")]
    if not text.strip():
        raise UcmctlError.one("no value given", key=key, fix=fix)
    for n, item in enumerate(items, 1):
        if not item:
            raise UcmctlError.one(f"item {n} of {text!r} is empty", key=key, fix=fix)
    return items


def parse_rates(text: str) -> list[float]:
    """`"inf"`, `"1,2,4"`, `"0.5, inf"` -> rates in req/s (math.inf for inf), in the order given.
    0, negatives, nan, non-numbers, empty items and duplicates -> a one-line UcmctlError."""
    rates: list[float] = []
    for item in _items(text, _RATE_KEY, _RATE_FIX):
        try:
            rate = float(item)
        except ValueError:
            raise UcmctlError.one(f"{item!r} is not a request rate", key=_RATE_KEY, fix=_RATE_FIX) from None
        if math.isnan(rate) or rate <= 0:
            raise UcmctlError.one(
                f"{item!r} is not a request rate: it must be > 0", key=_RATE_KEY, fix=_RATE_FIX
            )
        if rate in rates:
            raise UcmctlError.one(
                f"{item!r}: rate {format_rate(rate)} is given twice", key=_RATE_KEY, fix=_RATE_FIX
            )
        rates.append(rate)
    return rates


def parse_concurrencies(text: str) -> list[int]:
    """`"8"`, `"1,2,4,8"` -> concurrencies in the order given. 0, negatives, non-integers, empty
    items and duplicates -> a one-line UcmctlError."""
    values: list[int] = []
    for item in _items(text, _CONC_KEY, _CONC_FIX):
        try:
            value = int(item)
        except ValueError:
            raise UcmctlError.one(
                f"{item!r} is not a concurrency: it must be a whole number", key=_CONC_KEY, fix=_CONC_FIX
            ) from None
        if value < 1:
            raise UcmctlError.one(
                f"{item!r} is not a concurrency: it must be >= 1", key=_CONC_KEY, fix=_CONC_FIX
            )
        if value in values:
            raise UcmctlError.one(
                f"{item!r}: concurrency {value} is given twice", key=_CONC_KEY, fix=_CONC_FIX
            )
        values.append(value)
    return values


def points(rates: Sequence[float], concurrencies: Sequence[int]) -> list[Point]:
    """Every (rate, concurrency) pair, rate-major, each list in the order given."""
    return [Point(float(r), int(c)) for r, c in itertools.product(rates, concurrencies)]


async def run_points(
    workload: WorkloadSpec,
    cfg: BenchConfig,
    points: list[Point],
    target: Target,
    progress: Progress | None,
    log: Callable[[str], None],
) -> list[Cell]:
    """The workload once per sweep point; one point is a plain run."""
    from ucmctl.bench.runner import BenchConfig

    cells: list[Cell] = []
    width = workload.streams_per_run(cfg)
    for j, point in enumerate(points):
        run_cfg = BenchConfig(
            **{
                **cfg.__dict__,
                "request_rate": point.request_rate,
                "concurrency": point.concurrency,
                "stream_base": cfg.stream_base + j * width,
            }
        )
        name = point_name(point, points)
        if len(points) > 1:
            log(f"sweep point {j + 1}/{len(points)}: {point.label()}")
        for cell in await workload.run(run_cfg, target, progress, log):
            cell.point = point.as_dict()
            if len(points) > 1:
                cell.point_name = name
            cells.append(cell)
    return cells


def point_name(point: Point, points: list[Point]) -> str:
    """The point by what varies across the sweep only: `conc 8`, `2/s`, or both."""
    rates = {p.request_rate for p in points}
    concs = {p.concurrency for p in points}
    parts = []
    if len(rates) > 1:
        parts.append(f"rate {format_rate(point.request_rate)}")
    if len(concs) > 1 or not parts:
        parts.append(f"conc {point.concurrency}")
    return " ".join(parts)
