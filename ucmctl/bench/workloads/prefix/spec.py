"""The guides' workload: per input length, preseed then measure (`runner.run_bench`, beside it). Its
parameters (input lengths, prefix ratio, prompts per phase, repeats) are the run's own
(`BenchConfig`), as they are top-level keys of a suite."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from ucmctl.bench.workloads.base import WorkloadSpec

if TYPE_CHECKING:
    from ucmctl.bench.runner import BenchConfig, Progress, Target


class PrefixSpec(WorkloadSpec):
    kind: Literal["prefix"] = "prefix"

    default_output_len: ClassVar[int] = 1000
    own_options: ClassVar[frozenset[str]] = frozenset({"--input-len", "--fault"})

    def default_concurrency(self) -> int:
        return 128

    def in_flight_tokens(self, cfg: BenchConfig, concurrency: int) -> int | None:
        longest = max(cfg.input_lens) if cfg.input_lens else 0
        return min(concurrency, cfg.num_prompts) * (longest + cfg.output_len)

    def streams_per_run(self, cfg: BenchConfig) -> int:
        return cfg.repeats * len(cfg.input_lens)

    async def run(
        self, cfg: BenchConfig, target: Target, progress: Progress | None, log: Callable[[str], None]
    ) -> list[dict[str, Any]]:
        from ucmctl.bench.workloads.prefix.runner import run_bench

        cells = await run_bench(cfg, target, progress, log)
        for cell in cells:
            cell.setdefault("workload", self.kind)
            cell.setdefault("label", str(cell["input_len"]))
            cell["primary"] = True
        return cells
