"""A saved result's typed shape: the record (`bench --save`, a history's run), its cells and
their preseed and measure phases, for every readable `schema_version` (1: cells without
`workload` and `label`, read as prefix; 2). The keys a model does not name are kept as they
were (extra), so a record reads and dumps back to the same values; numbers keep their type
(an int stays an int). Nothing in ucmctl reads through these models yet: the runners, the
report, compare, history, suite and the plots move onto them one by one (issue 46, item 1)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, field_validator

SCHEMA_VERSION = 2  # 2: cells name their workload and label; version 1 results read the same
READABLE_VERSIONS = (1, 2)
Number = int | float  # a smart union: a JSON integer stays an int


class _Open(BaseModel):
    """Named fields typed; any other key kept as it is."""

    model_config = ConfigDict(extra="allow")

    def document(self) -> dict[str, Any]:
        """The JSON object this was read from: the keys it had, none added."""
        return self.model_dump(mode="json", exclude_unset=True)


class Phase(_Open):
    """One phase's figures, under `vllm bench serve`'s key names (ms; per second)."""

    duration: Number | None = None
    completed: int = 0
    failed: int = 0
    num_prompts: int | None = None
    input_len: int | None = None
    output_len: int | None = None
    request_throughput: Number | None = None
    output_throughput: Number | None = None
    total_token_throughput: Number | None = None
    mean_ttft_ms: Number | None = None
    p99_ttft_ms: Number | None = None
    mean_tpot_ms: Number | None = None
    p99_tpot_ms: Number | None = None
    mean_itl_ms: Number | None = None
    p99_itl_ms: Number | None = None
    mean_e2el_ms: Number | None = None
    p99_e2el_ms: Number | None = None
    errors: list[dict[str, Any]] = []
    hit_rate: dict[str, Any] | None = None  # measured: per instance and in total
    lost: list[dict[str, Any]] | None = None  # processes lost while it ran (a deployment's run)
    fault: dict[str, Any] | None = None  # --fault: what was injected and what it cost


class Cell(_Open):
    """One measured cell: a workload's (input length, repeat, sweep point, round ...)."""

    workload: str = "prefix"  # version 1: the only workload there was
    label: str | None = None
    input_len: int | None = None
    repeat: int = 0
    scenario: str | None = None  # a suite's: recompute, hbm, ucm
    preseed: Phase | None = None
    measure: Phase | None = None
    primary: bool = False  # the cell the tables lead with
    aggregate: bool = False  # repeats its cells' requests (multi-turn's later rounds)


class Record(_Open):
    """A saved result: its provenance, config, target and cells."""

    schema_version: int
    kind: Literal["ucmctl-bench-result"]
    provenance: dict[str, Any]
    config: dict[str, Any]
    target: dict[str, Any] = {}
    cells: list[Cell]

    @field_validator("schema_version")
    @classmethod
    def _readable(cls, version: int) -> int:
        if version not in READABLE_VERSIONS:
            raise ValueError(f"schema_version {version} is not {SCHEMA_VERSION}")
        return version


def read_record(doc: dict[str, Any]) -> Record:
    """A saved result (`bench --save`'s JSON, a history's run) as its typed record."""
    return Record.model_validate(doc)
