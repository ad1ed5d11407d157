"""Each workload's parameters, stated once as plain values: name, default, lower bound and help.
Its spec's fields (bench/workloads/) take their defaults and bounds from here, and
`ucmctl bench`'s options their defaults, bounds and help, so that `ucmctl` starts without
loading pydantic and the specs (0.26 s against 0.5 s for every command)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

RepeatMode = Literal["random", "tile", "interleave"]  # long-doc's query orders


@dataclass(frozen=True)
class Param:
    """One parameter of a workload: its spec's field `name` and `ucmctl bench`'s `--name`
    (underscores as dashes), its default, its lower bound (None: none) and its option's help."""

    name: str
    default: Any
    help: str
    ge: int | None = None

    @property
    def option(self) -> str:
        return "--" + self.name.replace("_", "-")


def _table(*params: Param) -> dict[str, Param]:
    return {p.name: p for p in params}


MULTI_TURN_PARAMS = _table(
    Param("users", 16, "multi-turn: users (conversations)", ge=1),
    Param("rounds", 4, "multi-turn: rounds per user", ge=1),
    Param("system_tokens", 1024, "multi-turn: the system prompt every user shares", ge=0),
    Param("question_tokens", 128, "multi-turn: each new question", ge=1),
)
LONG_DOC_PARAMS = _table(
    Param("documents", 8, "long-doc: documents", ge=1),
    Param("doc_tokens", 8192, "long-doc: tokens per document", ge=1),
    Param("repeat_count", 2, "long-doc: times each is queried", ge=1),
    Param("repeat_mode", "random", "long-doc: random, tile or interleave"),
)


@dataclass(frozen=True)
class Trace:
    trace: str | None = None
    speedup: float | None = 1.0  # None: back to back


TRACE = Trace()  # its option and its field differ in their bounds and help: stated apart
