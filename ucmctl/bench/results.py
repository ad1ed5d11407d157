"""A saved result's typed shape: the record (`bench --save`, a history's run), its cells and
their preseed and measure phases, for every readable `schema_version` (1: cells without
`workload` and `label`, read as prefix; 2). The keys a model does not name are kept as they
were (extra), so a record reads and dumps back to the same values in the same key order
(`open_model.Open.document`); numbers keep their type (an int stays an int). Runners build
them (`runner.measure` a phase, each workload's runner its cells); a saved result's and a
history run's are read once through `cells_of`; the report, compare, the history and the suite
read them typed. A phase's fields are its core (`vllm bench
serve`'s figures, the failures, the measured hit rates) and those of each per-phase extra
(`bench/extras/`): the report says each extra's lines under its tables."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field, PrivateAttr, field_validator

from ucmctl.bench.cells import cell_key, first_leg_of, row_name
from ucmctl.bench.extras.fault import FaultFields
from ucmctl.bench.extras.goodput import GoodputFields
from ucmctl.bench.extras.handover import HandoverFields
from ucmctl.bench.extras.lost import LostFields
from ucmctl.bench.extras.paths import PathsFields
from ucmctl.bench.extras.series import SeriesFields
from ucmctl.bench.extras.trace_lag import TraceLagFields
from ucmctl.bench.open_model import Open

if TYPE_CHECKING:
    from ucmctl.bench.client import RequestResult

SCHEMA_VERSION = 2  # 2: cells name their workload and label; version 1 results read the same
READABLE_VERSIONS = (1, 2)
Number = int | float  # a smart union: a JSON integer stays an int


class ErrorCount(Open):
    """Failed requests of one error."""

    error: str
    count: int


class HitRate(Open):
    """The hit rates measured off the instances' /metrics: in total (with the counters, e.g.
    preemptions and the UCM store's errors), by role and per instance; the instances not read
    and those started again within the phase."""

    total: dict[str, Any] | None = None
    by_role: dict[str, dict[str, Any] | None] | None = None
    missing: list[str] | None = None
    restarted: list[str] | None = None

    def first_leg(self) -> float | None:
        """`cells.first_leg_of`: the share of prompt tokens not computed where a request first
        lands."""
        return first_leg_of({"by_role": self.by_role, "total": self.total})


class Phase(
    LostFields, HandoverFields, PathsFields, FaultFields, GoodputFields, TraceLagFields, SeriesFields
):
    """One phase's figures, under `vllm bench serve`'s key names (ms; per second), and the
    fields of the per-phase extras."""

    duration: Number | None = None
    completed: int = 0
    failed: int = 0
    total_input_tokens: int | None = None
    total_output_tokens: int | None = None
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
    errors: list[ErrorCount] = Field(default_factory=list)
    hit_rate: HitRate | None = None  # measured: per instance and in total
    _requests: list[RequestResult] = PrivateAttr(default_factory=list)  # as sent; never saved

    def requests(self) -> list[RequestResult]:
        """Its requests as `runner.measure` sent them, for the runner that built it (a saved
        phase has none)."""
        return self._requests

    def hit_rates(self) -> dict[str, Any]:
        """The measured hit rates as `hitrate.hit_rates` gave them ({} where none were read)."""
        return self.hit_rate.document() if self.hit_rate else {}

    def totals(self) -> dict[str, Any]:
        """The measured hit rates and counters in total ({} where none were read)."""
        return (self.hit_rate.total if self.hit_rate else None) or {}

    def first_leg(self) -> float | None:
        """`HitRate.first_leg`; None where no hit rate was read."""
        return self.hit_rate.first_leg() if self.hit_rate else None


class Cell(Open):
    """One measured cell: a workload's (input length, repeat, sweep point, round ...)."""

    workload: str | None = "prefix"  # version 1: the only workload there was
    label: str | None = None
    input_len: int | None = None
    repeat: int = 0
    stream: int | None = None  # the prompts' stream number (`prompts.prompt_ids`)
    prompts_digest: str | None = None  # of the prompts it sent
    scenario: str | None = None  # a suite's: recompute, hbm, ucm
    point: dict[str, Any] | None = None  # the sweep point: request_rate, max_concurrency
    point_name: str | None = None  # named when the run swept several points
    prefix_ratio: Number | None = None  # prefix: the share of each prompt asked to be reused
    ideal_hit_rate: Number | None = None  # the hit rate the workload allows
    ideal_reused_tokens: int | None = None  # of its prompts' tokens, those a cache could hold
    ideal_total_tokens: int | None = None
    round: int | None = None  # multi-turn: its round (None: rounds 2..R together)
    warmup_ideal_hit_rate: Number | None = None  # long-doc: of its warm-up round
    speedup: Number | None = None  # trace: as replayed (None: back to back)
    trace_requests: int | None = None  # trace: its requests
    preseed: Phase | None = None
    measure: Phase | None = None
    primary: bool = False  # the cell the tables lead with
    aggregate: bool = False  # repeats its cells' requests (multi-turn's later rounds)

    def workload_name(self) -> str:
        """`cells.workload_of`: its workload, prefix where none is named."""
        return self.workload or "prefix"

    def _names(self) -> dict[str, Any]:
        return {
            "workload": self.workload,
            "label": self.label,
            "input_len": self.input_len,
            "point_name": self.point_name,
        }

    def row_name(self) -> str:
        """`cells.row_name`: its label (else input length), and its sweep point."""
        return row_name(self._names())

    def key(self) -> str:
        """`cells.cell_key`: what `bench compare` and the history pair it by (with the scenario)."""
        return cell_key(self._names())

    def label_name(self) -> str:
        """`cells.label_of`: its label, else its input length."""
        return str(self.label or self.input_len)

    def ideal(self) -> float | None:
        """The hit rate the workload allows: its reusable fraction, else the prefix ratio asked."""
        return self.ideal_hit_rate if self.ideal_hit_rate is not None else self.prefix_ratio

    def phases(self) -> list[tuple[str, Phase]]:
        """Its phases that ran (preseed, measure), each with its key."""
        both = (("preseed", self.preseed), ("measure", self.measure))
        return [(key, p) for key, p in both if p is not None and p.given()]


def cells_of(cells: Iterable[Cell | dict[str, Any]]) -> list[Cell]:
    """Cells as typed: a saved result's dicts read; a runner's (typed) as they are."""
    return [c if isinstance(c, Cell) else Cell.model_validate(c) for c in cells]


class Record(Open):
    """A saved result: its provenance, config, target and cells."""

    schema_version: int
    kind: Literal["ucmctl-bench-result"]
    provenance: dict[str, Any]
    config: dict[str, Any]
    target: dict[str, Any] = Field(default_factory=dict)
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
