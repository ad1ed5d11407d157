"""Each workload's parameters, stated once as plain values: name, default, bounds, type and help.
Its spec's fields (bench/workloads/) take their defaults and bounds from here, and
`ucmctl bench`'s options (`commands/run_options.py` makes one per parameter) their names,
defaults, bounds and help, so that `ucmctl` starts
without loading pydantic and the specs (0.26 s against 0.5 s for every command)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

RepeatMode = Literal["random", "tile", "interleave"]  # long-doc's query orders
DEFAULT_INPUT_LEN = 4096


@dataclass(frozen=True)
class Param:
    """One parameter of a workload: its spec's field `name` and `ucmctl bench`'s `--name`
    (underscores as dashes), its default, its bounds (None: none), the option's type where the
    default does not say it, and the option's help."""

    name: str
    default: Any
    help: str
    ge: int | float | None = None
    le: int | float | None = None
    type: Any = None

    @property
    def option(self) -> str:
        return "--" + self.name.replace("_", "-")

    @property
    def annotation(self) -> Any:
        """The option's type, as Typer reads it."""
        return self.type if self.type is not None else type(self.default)


def _table(*params: Param) -> dict[str, Param]:
    return {p.name: p for p in params}


PREFIX_PARAMS = _table(
    Param(
        "input_len",
        None,
        f"prefix: measured prompt lengths, e.g. 4096,8192 (default {DEFAULT_INPUT_LEN}, less where "
        "the server's max_model_len leaves no room for --output-len)",
        type=str | None,
    ),
    Param("prefix_ratio", 0.8, "prefix: preseed length / input length (0: no preseed)", ge=0.0, le=0.999),
    Param("num_prompts", 128, "prefix: prompts per phase", ge=1),
    Param(
        "reset_hbm",
        False,
        "prefix: clear every instance's local prefix cache between the phases "
        "(real vLLM: needs VLLM_SERVER_DEV_MODE=1)",
    ),
    Param("repeats", 1, "prefix: run everything N times (fresh prompts)", ge=1),
)
MULTI_TURN_PARAMS = _table(
    Param("users", 16, "multi-turn: users (conversations)", ge=1),
    Param("rounds", 4, "multi-turn: rounds per user", ge=1),
    Param("system_tokens", 1024, "multi-turn: the system prompt every user shares", ge=0),
    Param("question_tokens", 128, "multi-turn: each new question", ge=1),
)
TRACE_PARAMS = _table(
    Param(
        "trace", None, "trace: a JSONL trace in Mooncake's format (docs/trace-format.md)", type=Path | None
    ),
    Param("speedup", 1.0, "trace: replay X times faster than its timestamps"),
    Param("back_to_back", False, "trace: ignore the timestamps, keep --concurrency requests in flight"),
)
LONG_DOC_PARAMS = _table(
    Param("documents", 8, "long-doc: documents", ge=1),
    Param("doc_tokens", 8192, "long-doc: tokens per document", ge=1),
    Param("repeat_count", 2, "long-doc: times each is queried", ge=1),
    Param("repeat_mode", "random", "long-doc: random, tile or interleave"),
)
# Every workload's, in the order `ucmctl bench --help` lists them.
PARAMS: dict[str, dict[str, Param]] = {
    "prefix": PREFIX_PARAMS,
    "multi-turn": MULTI_TURN_PARAMS,
    "trace": TRACE_PARAMS,
    "long-doc": LONG_DOC_PARAMS,
}
