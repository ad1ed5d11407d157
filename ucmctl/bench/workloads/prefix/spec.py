"""The guides' workload: per input length, preseed then measure (`runner.run_bench`, beside it).
Its parameters: the input lengths, the prefix ratio, the prompts per phase, the repeats and
whether the local caches are reset between the phases; a suite gives them as its own top-level
keys (`input_lens`, ...), `ucmctl bench` as `--input-len`, ..."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from pydantic import Field

from ucmctl.bench.workload_defaults import PREFIX_PARAMS as P
from ucmctl.bench.workloads.base import WorkloadSpec, field_of

if TYPE_CHECKING:
    from ucmctl.bench.results import Cell
    from ucmctl.bench.runner import BenchConfig, Progress, Target


class PrefixSpec(WorkloadSpec):
    kind: Literal["prefix"] = "prefix"
    # `--input-len`, or the default that fits the server's context (`ucmctl bench` fills it in)
    input_lens: list[int] = Field(default_factory=list)
    prefix_ratio: float = field_of(P["prefix_ratio"])
    num_prompts: int = field_of(P["num_prompts"])
    reset_hbm: bool = field_of(P["reset_hbm"])
    repeats: int = field_of(P["repeats"])

    default_output_len: ClassVar[int] = 1000
    own_options: ClassVar[frozenset[str]] = frozenset({"--input-len", "--fault"})

    @classmethod
    def from_options(cls, options: dict[str, Any]) -> WorkloadSpec:
        """Its options but `--input-len`, which `ucmctl bench` reads once the server's context
        length is known."""
        return super().from_options({**options, "input_lens": []})

    def default_concurrency(self) -> int:
        return 128

    def take_input_lens(self, lengths: list[int]) -> None:
        self.input_lens = lengths

    def measure_requests(self) -> int | None:
        return self.num_prompts

    def in_flight_tokens(self, cfg: BenchConfig, concurrency: int) -> int | None:
        longest = max(self.input_lens) if self.input_lens else 0
        return min(concurrency, self.num_prompts) * (longest + cfg.output_len)

    def streams_per_run(self, cfg: BenchConfig) -> int:
        return self.repeats * len(self.input_lens)

    async def run(
        self, cfg: BenchConfig, target: Target, progress: Progress | None, log: Callable[[str], None]
    ) -> list[Cell]:
        from ucmctl.bench.workloads.prefix.runner import run_bench

        cells = await run_bench(cfg, self, target, progress, log)
        for cell in cells:
            cell.workload, cell.label, cell.primary = self.kind, str(cell.input_len), True
        return cells
