"""Which workload a bench run sends, over which sweep points: one entry for the CLI and suites.

Workloads: `prefix` (the guides' preseed-and-measure, `runner.run_bench`), `multi-turn`,
`trace` and `long-doc`. A sweep runs the workload once per (request rate, concurrency) point,
each point with prompts of its own (a later point never hits what an earlier one cached), and
names the point in each cell's label when there is more than one.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from ucmctl.bench import trace
from ucmctl.bench.longdoc import LongDoc, run_long_doc
from ucmctl.bench.multiturn import MultiTurn, run_multi_turn
from ucmctl.bench.replay import TraceReplay, run_trace
from ucmctl.bench.replay import in_flight_tokens as trace_in_flight
from ucmctl.bench.runner import BenchConfig, Progress, Target, run_bench
from ucmctl.bench.sweep import Point, format_rate
from ucmctl.core.errors import UcmctlError

WORKLOADS: tuple[str, ...] = ("prefix", "multi-turn", "trace", "long-doc")
DEFAULT_OUTPUT_LEN = {"prefix": 1000, "multi-turn": 128, "long-doc": 100}


@dataclass
class Workload:
    kind: str = "prefix"
    multi_turn: MultiTurn | None = None
    long_doc: LongDoc | None = None
    replay: TraceReplay | None = None
    requests: list[trace.TraceRequest] = field(default_factory=list)  # the trace, loaded once

    def __post_init__(self) -> None:
        if self.kind not in WORKLOADS:
            raise UcmctlError.one(
                f"unknown workload '{self.kind}'", key="--workload", fix=f"use one of {', '.join(WORKLOADS)}"
            )

    def describe(self) -> dict[str, Any]:
        """The workload's own parameters, for the result's config."""
        spec: dict[str, Any] = {"workload": self.kind}
        for part in (self.multi_turn, self.long_doc):
            if part is not None:
                spec.update(asdict(part))
        if self.replay is not None:
            spec.update({"trace": str(self.replay.path), "speedup": self.replay.speedup})
        return spec

    def in_flight_tokens(self, cfg: BenchConfig, concurrency: int) -> int | None:
        """Tokens the workload keeps in flight at most (the capacity check's side)."""
        if self.multi_turn is not None:
            return self.multi_turn.in_flight_tokens(concurrency)
        if self.long_doc is not None:
            return self.long_doc.in_flight_tokens(concurrency, cfg.output_len)
        if self.replay is not None:
            return trace_in_flight(self.requests, concurrency, self.replay.speedup)
        longest = max(cfg.input_lens) if cfg.input_lens else 0
        return min(concurrency, cfg.num_prompts) * (longest + cfg.output_len)

    async def run(
        self, cfg: BenchConfig, target: Target, progress: Progress | None, log: Callable[[str], None]
    ) -> list[dict[str, Any]]:
        if self.multi_turn is not None:
            return await run_multi_turn(cfg, self.multi_turn, target, progress)
        if self.long_doc is not None:
            return await run_long_doc(cfg, self.long_doc, target, progress)
        if self.replay is not None:
            return await run_trace(cfg, self.replay, target, progress, self.requests or None)
        cells = await run_bench(cfg, target, progress, log)
        for cell in cells:
            cell.setdefault("workload", "prefix")
            cell.setdefault("label", str(cell["input_len"]))
            cell["primary"] = True
        return cells

    def streams_per_run(self, cfg: BenchConfig) -> int:
        return cfg.repeats * len(cfg.input_lens) if self.kind == "prefix" else 1


async def run_points(
    workload: Workload,
    cfg: BenchConfig,
    points: list[Point],
    target: Target,
    progress: Progress | None,
    log: Callable[[str], None],
) -> list[dict[str, Any]]:
    """The workload once per sweep point; one point is a plain run."""
    cells: list[dict[str, Any]] = []
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
            cell["point"] = point.as_dict()
            if len(points) > 1:
                cell["point_name"] = name
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


def prompts_digest(cells: list[dict[str, Any]]) -> str | None:
    """One digest of every cell's prompts, for the provenance."""
    parts = [str(c.get("prompts_digest")) for c in cells if c.get("prompts_digest")]
    if not parts:
        return None
    return hashlib.sha256("|".join(parts).encode()).hexdigest()[:16]
