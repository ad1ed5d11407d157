"""The long-document workload's spec: D documents of L tokens, warmed up once, then each queried
`repeat_count` times in the repeat mode's order (runner: `runner.py` beside it)."""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import TYPE_CHECKING, ClassVar, Literal, get_args

from ucmctl.bench.workload_defaults import LONG_DOC_PARAMS as P
from ucmctl.bench.workload_defaults import RepeatMode
from ucmctl.bench.workloads.base import WorkloadSpec, field_of
from ucmctl.core.errors import UcmctlError

if TYPE_CHECKING:
    from pathlib import Path

    from ucmctl.bench.results import Cell
    from ucmctl.bench.runner import BenchConfig, Progress, Target

REPEAT_MODES: tuple[str, ...] = get_args(RepeatMode)


class LongDocSpec(WorkloadSpec):
    kind: Literal["long-doc"] = "long-doc"
    documents: int = field_of(P["documents"])
    doc_tokens: int = field_of(P["doc_tokens"])
    repeat_count: int = field_of(P["repeat_count"])
    repeat_mode: RepeatMode = field_of(P["repeat_mode"])

    phases: ClassVar[dict[str, str]] = {"preseed": "warm-up", "measure": "query"}
    default_output_len: ClassVar[int] = 100  # each query

    def default_concurrency(self) -> int:
        return 8

    def load(self, base: Path) -> None:
        if self.repeat_mode not in REPEAT_MODES:  # `--repeat-mode` is a plain string
            raise UcmctlError.one(
                f"unknown repeat mode '{self.repeat_mode}'",
                key="--repeat-mode",
                fix=f"use one of {', '.join(REPEAT_MODES)}",
            )

    def check(self, output_len: int, max_model_len: int | None) -> None:
        if max_model_len is not None and self.doc_tokens + output_len > max_model_len:
            raise UcmctlError.one(
                f"a document of {self.doc_tokens} tokens and {output_len} output tokens exceed the "
                f"server's max_model_len {max_model_len}",
                key="--doc-tokens",
            )

    def order(self, seed: int) -> list[int]:
        """The query round's documents, in the order they are sent."""
        d, n = self.documents, self.repeat_count
        if self.repeat_mode == "interleave":
            return [i for i in range(d) for _ in range(n)]
        tiled = [i for _ in range(n) for i in range(d)]
        if self.repeat_mode == "random":
            random.Random(seed).shuffle(tiled)
        return tiled

    def in_flight_tokens(self, cfg: BenchConfig, concurrency: int) -> int | None:
        return min(concurrency, self.documents * self.repeat_count) * (self.doc_tokens + cfg.output_len)

    async def run(
        self, cfg: BenchConfig, target: Target, progress: Progress | None, log: Callable[[str], None]
    ) -> list[Cell]:
        from ucmctl.bench.workloads.long_doc.runner import run_long_doc

        return await run_long_doc(cfg, self, target, progress)
