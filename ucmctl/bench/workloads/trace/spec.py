"""The trace workload's spec: a Mooncake-format trace replayed on its timestamps, `speedup`
times faster, or back to back (runner: `runner.py`; the format: `format.py`, beside it)."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from pydantic import Field, PrivateAttr

from ucmctl.bench.workload_defaults import TRACE_PARAMS as P
from ucmctl.bench.workloads.base import WorkloadSpec
from ucmctl.core.errors import UcmctlError

if TYPE_CHECKING:
    from ucmctl.bench.results import Cell
    from ucmctl.bench.runner import BenchConfig, Progress, Target
    from ucmctl.bench.workloads.trace.format import TraceRequest


class TraceSpec(WorkloadSpec):
    kind: Literal["trace"] = "trace"
    # The option's `--speedup` takes no bound and `--back-to-back` is None here: stated apart.
    trace: str | None = Field(P["trace"].default, description="trace file, relative to the suite file")
    speedup: float | None = Field(P["speedup"].default, gt=0, description="null: back to back")

    phases: ClassVar[dict[str, str]] = {"preseed": "-", "measure": "replay"}
    default_output_len: ClassVar[int] = 1000  # unused (each request has its own), kept in the config

    own_options: ClassVar[frozenset[str]] = frozenset({"--trace"})

    _path: Path | None = PrivateAttr(None)
    _requests: list[TraceRequest] = PrivateAttr(default_factory=list)  # the trace, read once

    def default_concurrency(self) -> int:
        return 1024

    @classmethod
    def from_options(cls, options: dict[str, Any]) -> WorkloadSpec:
        """`--trace FILE` (required), `--speedup` or `--back-to-back` (no speedup)."""
        if options["trace"] is None:
            raise UcmctlError.one(
                "the trace workload needs a trace",
                key="--trace",
                fix="--trace FILE.jsonl (`ucmctl bench make-trace` writes one)",
            )
        values = {
            **options,
            "trace": str(options["trace"]),
            "speedup": None if options["back_to_back"] else options["speedup"],
        }
        return super().from_options(values)

    def check_rates(self, rates: list[float]) -> None:
        if rates != [math.inf]:
            raise UcmctlError.one(
                "a trace is sent on its own timestamps",
                key="--request-rate",
                fix="use --speedup or --back-to-back",
            )

    def load(self, base: Path) -> None:
        from ucmctl.bench.workloads.trace.format import load_trace, send_schedule

        if not self.trace:
            raise UcmctlError.one("a trace workload needs `trace: FILE`", key="workload.trace")
        self._path = base / self.trace
        self._requests = load_trace(self._path)
        send_schedule(self._requests, self.speedup)  # checks --speedup

    @property
    def path(self) -> Path:
        if self._path is None:
            raise RuntimeError("TraceSpec.load first")
        return self._path

    @property
    def requests(self) -> list[TraceRequest]:
        if self._path is None:
            raise RuntimeError("TraceSpec.load first")
        return self._requests

    def describe(self, cfg: BenchConfig) -> dict[str, Any]:
        return {"workload": self.kind, "trace": str(self.path), "speedup": self.speedup}

    def in_flight_tokens(self, cfg: BenchConfig, concurrency: int) -> int | None:
        """Back to back: `concurrency` requests of the trace's mean size. On its timestamps how
        many overlap depends on how fast the server is: None (the preemptions are reported)."""
        if self.speedup is not None:
            return None
        reqs = self.requests
        mean = sum(r.input_length + r.output_length for r in reqs) / len(reqs)
        return int(min(concurrency, len(reqs)) * mean)

    async def run(
        self, cfg: BenchConfig, target: Target, progress: Progress | None, log: Callable[[str], None]
    ) -> list[Cell]:
        from ucmctl.bench.workloads.trace.runner import run_trace

        return await run_trace(cfg, self, target, progress)
