"""The multi-turn workload's spec: U users x R rounds over one shared system prompt, each
answer (`--output-len` tokens) carried into the user's next round (runner: `runner.py` beside it)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from ucmctl.bench.workload_defaults import MULTI_TURN_PARAMS as P
from ucmctl.bench.workloads.base import WorkloadSpec, field_of
from ucmctl.core.errors import UcmctlError

if TYPE_CHECKING:
    from ucmctl.bench.results import Cell
    from ucmctl.bench.runner import BenchConfig, Progress, Target


class MultiTurnSpec(WorkloadSpec):
    kind: Literal["multi-turn"] = "multi-turn"
    users: int = field_of(P["users"])
    rounds: int = field_of(P["rounds"])
    system_tokens: int = field_of(P["system_tokens"])
    question_tokens: int = field_of(P["question_tokens"])

    phases: ClassVar[dict[str, str]] = {"preseed": "-", "measure": "measure"}
    default_output_len: ClassVar[int] = 128  # each answer

    def default_concurrency(self) -> int:
        return self.users  # one per user

    def longest_prompt(self, answer_tokens: int) -> int:
        return self.system_tokens + self.rounds * self.question_tokens + (self.rounds - 1) * answer_tokens

    def check(self, output_len: int, max_model_len: int | None) -> None:
        need = self.longest_prompt(output_len) + output_len
        if max_model_len is not None and need > max_model_len:
            raise UcmctlError.one(
                f"the last round needs {need} tokens (system {self.system_tokens} + "
                f"{self.rounds} x question {self.question_tokens} + {self.rounds} x answer "
                f"{output_len}), more than the server's max_model_len {max_model_len}",
                key="--rounds",
                fix="fewer rounds or shorter prompts",
            )

    def describe(self, cfg: BenchConfig) -> dict[str, Any]:
        return {**super().describe(cfg), "answer_tokens": cfg.output_len}

    def in_flight_tokens(self, cfg: BenchConfig, concurrency: int) -> int | None:
        return min(concurrency, self.users) * (self.longest_prompt(cfg.output_len) + cfg.output_len)

    async def run(
        self, cfg: BenchConfig, target: Target, progress: Progress | None, log: Callable[[str], None]
    ) -> list[Cell]:
        from ucmctl.bench.workloads.multi_turn.runner import run_multi_turn

        return await run_multi_turn(cfg, self, target, progress)
