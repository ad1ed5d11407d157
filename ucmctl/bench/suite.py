"""Scenario suites: a matrix of input lengths x scenarios on one topology, redeployed between
scenarios, resumable.

A scenario is a topology override: `recompute` (no UCM store, vLLM prefix caching off),
`hbm` (no UCM store, prefix caching on), `ucm` (the topology as written, connector on).
Finished cells are appended, one JSON line each, to the suite's results file; a later run of
the same suite skips them (and a scenario whose cells are all finished is not deployed).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import secrets
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal, Protocol

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_serializer,
    field_validator,
    model_validator,
)

from ucmctl.bench.results import Cell, cells_of
from ucmctl.bench.runner import BenchConfig, Target
from ucmctl.bench.workloads import BY_KIND, AnyWorkload, PrefixSpec, WorkloadSpec
from ucmctl.core.errors import ExitStatus, UcmctlError
from ucmctl.topology.digest_compat import without_newer
from ucmctl.topology.model import FlagValue, Topology

Scenario = Literal["recompute", "hbm", "ucm"]
SCENARIOS: tuple[str, ...] = ("recompute", "hbm", "ucm")


def _all_scenarios() -> list[Scenario]:
    return ["recompute", "hbm", "ucm"]


# The workloads suites had before each had a spec of its own: a suite's workload of these kinds
# dumps (its digest, the saved config) as the one flat model of all their parameters did, so that
# a results file of before still resumes.
_FLAT_KINDS = ("prefix", "multi-turn", "long-doc", "trace")


# The prefix workload's parameters are the suite's top-level keys (`input_lens`, ...), never its
# `workload:`'s: they are dumped there, not in the workload.
_SUITE_KEYS = frozenset(PrefixSpec.model_fields) - {"kind"}


def _dump(spec: WorkloadSpec) -> dict[str, Any]:
    return spec.model_dump(mode="json", exclude=set(_SUITE_KEYS) if isinstance(spec, PrefixSpec) else None)


def _flat_dump(workload: WorkloadSpec) -> dict[str, Any]:
    """The spec's parameters; one of `_FLAT_KINDS` with every other of those kinds' at its default."""
    own = _dump(workload)
    if workload.kind not in _FLAT_KINDS:
        return own
    flat: dict[str, Any] = {}
    for kind in _FLAT_KINDS:
        flat.update(_dump(BY_KIND[kind].model_validate({})))
    return {**flat, **own}


class Suite(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")
    topology: str = Field(description="topology file, relative to the suite file")
    scenarios: list[Scenario] = Field(default_factory=lambda: _all_scenarios(), min_length=1)
    workload: AnyWorkload | None = None  # the guides' prefix workload when absent
    input_lens: list[int] = Field(default_factory=list, description="prefix workload: required")
    output_len: int = Field(1000, ge=1)
    prefix_ratio: float = Field(0.8, ge=0, lt=1)
    num_prompts: int = Field(128, ge=1)
    concurrency: int = Field(128, ge=1)
    request_rate: float | Literal["inf"] = "inf"
    ignore_eos: bool = True
    seed: int = Field(0, ge=0)
    reset_hbm: bool = False
    repeats: int = Field(1, ge=1)
    vocab: int | None = Field(None, description="default: the model folder's, else 8000")
    settle_s: float = Field(0.0, ge=0)
    side_flags: dict[str, FlagValue] = Field(
        default_factory=dict, description="vLLM flags added to every side, every scenario"
    )

    @field_validator("workload", mode="before")
    @classmethod
    def _prefix_by_default(cls, value: Any) -> Any:
        """A workload without a kind is the prefix one."""
        if isinstance(value, dict) and "kind" not in value:
            return {**value, "kind": "prefix"}
        return value

    @field_validator("workload")
    @classmethod
    def _prefix_takes_the_suites_keys(cls, value: WorkloadSpec | None) -> WorkloadSpec | None:
        given = sorted(value.model_fields_set & _SUITE_KEYS) if isinstance(value, PrefixSpec) else []
        if given:
            raise ValueError(
                f"{given[0]}: the prefix workload's parameters are the suite's own keys "
                f"({', '.join(sorted(_SUITE_KEYS))}), not the workload's"
            )
        return value

    @field_serializer("workload")
    def _dump_workload(self, workload: WorkloadSpec | None) -> dict[str, Any] | None:
        return None if workload is None else _flat_dump(workload)

    @model_validator(mode="after")
    def _lengths_for_prefix(self) -> Suite:
        if self.kind == "prefix" and not self.input_lens:
            raise ValueError("input_lens: the prefix workload needs at least one input length")
        if self.kind != "prefix" and self.input_lens:
            raise ValueError(f"input_lens: only the prefix workload has input lengths, not {self.kind}")
        return self

    def spec(self) -> WorkloadSpec:
        """The suite's workload: the guides' prefix one when it names none, with the suite's
        input lengths, prefix ratio, prompts and cache reset (a suite runs the repeats itself)."""
        return self.cell_spec(self.input_lens)

    def cell_spec(self, input_lens: list[int]) -> WorkloadSpec:
        """The workload of one cell of the suite: the prefix one at these input lengths, once."""
        if self.workload is not None and not isinstance(self.workload, PrefixSpec):
            return self.workload
        return PrefixSpec(
            input_lens=input_lens,
            prefix_ratio=self.prefix_ratio,
            num_prompts=self.num_prompts,
            reset_hbm=self.reset_hbm,
            repeats=1,
        )

    @property
    def kind(self) -> str:
        return self.workload.kind if self.workload is not None else "prefix"

    def digest(self) -> str:
        # A suite without a workload digests as before workloads existed: its results resume.
        data = without_newer("suite", self.model_dump(mode="json"))
        text = json.dumps(data, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def lengths(self) -> list[int]:
        return self.input_lens if self.kind == "prefix" else [0]

    def cells(self) -> list[tuple[str, int, int]]:
        """(scenario, input length or 0, repeat) in run order: one deployment per scenario."""
        return [(s, n, r) for s in self.scenarios for r in range(self.repeats) for n in self.lengths()]

    def bench_config(self, vocab: int) -> BenchConfig:
        rate = math.inf if self.request_rate == "inf" else float(self.request_rate)
        return BenchConfig(
            concurrency=self.concurrency,
            output_len=self.output_len,
            request_rate=rate,
            ignore_eos=self.ignore_eos,
            seed=self.seed,
            vocab=vocab,
            settle_s=self.settle_s,
        )


def load_suite(path: Path) -> Suite:
    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise UcmctlError.one(f"cannot read the suite: {exc}", file=str(path)) from None
    try:
        return Suite.model_validate(data)
    except ValidationError as exc:
        problems = [f"{'.'.join(_where(e['loc'])) or '(top)'}: {e['msg']}" for e in exc.errors()]
        raise UcmctlError.one("; ".join(problems), file=str(path)) from None


def _where(loc: tuple[int | str, ...]) -> list[str]:
    """A problem's key as the suite writes it: `workload.users`, without the kind pydantic puts
    after `workload`."""
    keys = [str(x) for x in loc]
    if len(keys) > 1 and keys[0] == "workload" and keys[1] in BY_KIND:
        del keys[1]
    return keys


def apply_scenario(topology: Topology, scenario: str, side_flags: dict[str, Any] | None = None) -> Topology:
    """The topology a scenario runs: a copy with the store and prefix caching set as it says."""
    sides: dict[str, Any] = {}
    for name, side in topology.sides():
        flags = {**side.flags, **(side_flags or {})}
        if scenario == "recompute":
            flags["enable-prefix-caching"] = False
        sides[name] = side.model_copy(update={"flags": flags})
    update: dict[str, Any] = dict(sides)
    if scenario in ("recompute", "hbm"):
        update["storage"] = None
    elif scenario != "ucm":
        raise UcmctlError.one(f"unknown scenario '{scenario}'", fix=f"use one of {', '.join(SCENARIOS)}")
    new = topology.model_copy(update=update)
    # The digest names the file as written plus the override: the same in every checkout.
    override = json.dumps({"scenario": scenario, "side_flags": side_flags or {}}, sort_keys=True, default=str)
    new._written_digest = hashlib.sha256(f"{topology.digest()}|{override}".encode()).hexdigest()
    return new


# ---- the results file -------------------------------------------------------------------------
class ResultsFile:
    """JSON lines: a header per start of the suite, then one line per finished cell."""

    def __init__(self, path: Path, suite: Suite) -> None:
        self.path = path
        self.digest = suite.digest()
        self.done: dict[tuple[str, int, int], list[Cell]] = {}
        self.attempt = 0
        self.salt = secrets.randbelow(1 << 30)  # the first header keeps it: this file's own prompts

    def open(self, fresh: bool) -> None:
        if fresh and self.path.exists():
            self.path.unlink()
        if self.path.exists():
            for n, line in enumerate(self.path.read_text().splitlines(), 1):
                if not line.strip():
                    continue
                try:
                    rec = json.loads(line)
                except ValueError:  # a line cut short by the interruption: that cell runs again
                    continue
                if rec.get("type") == "header":
                    if rec.get("suite_digest") != self.digest:
                        raise UcmctlError.one(
                            "these results are from a different version of the suite",
                            file=str(self.path),
                            line=n,
                            fix="pass --fresh to start over, or another --results file",
                        )
                    if self.attempt == 0:
                        self.salt = int(rec.get("salt", self.salt))
                    self.attempt = max(self.attempt, int(rec.get("attempt", 0)) + 1)
                elif rec.get("type") == "cell":  # one run's cells ("cell": a file of before workloads)
                    cells = rec["cells"] if "cells" in rec else [rec["cell"]]
                    self.done[(rec["scenario"], rec["input_len"], rec["repeat"])] = cells_of(cells)
        self._append(
            {
                "type": "header",
                "suite_digest": self.digest,
                "attempt": self.attempt,
                "salt": self.salt,
                "finished_cells": len(self.done),
            }
        )

    def stream(self, *cell: int) -> int:
        text = ":".join(str(x) for x in (self.salt, self.attempt, *cell))
        return int(hashlib.sha256(text.encode()).hexdigest()[:12], 16)

    def record(self, key: tuple[str, int, int], cells: list[Cell]) -> None:
        self.done[key] = cells
        self._append(
            {
                "type": "cell",
                "scenario": key[0],
                "input_len": key[1],
                "repeat": key[2],
                "cells": [c.document() for c in cells],
            }
        )

    def _append(self, rec: dict[str, Any]) -> None:
        from ucmctl.bench.report import finite

        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("a") as f:
            f.write(json.dumps(finite(rec), separators=(",", ":"), default=str) + "\n")
            f.flush()
            os.fsync(f.fileno())


# ---- running ----------------------------------------------------------------------------------
class Deployer(Protocol):
    def up(self, topology: Topology, topology_path: str) -> Target: ...

    def down(self, deployment: str) -> None: ...


class DeployApi:
    """The real thing: ucmctl.deploy.api, then the deployment's endpoints from its state."""

    def up(self, topology: Topology, topology_path: str) -> Target:
        from ucmctl.bench.runner import target_from_deployment

        try:
            from ucmctl.deploy.api import deploy_up
        except ImportError:
            raise UcmctlError.one(
                "this ucmctl has no deploy API (ucmctl.deploy.api) to run suites with",
                status=ExitStatus.FAILURE,
            ) from None
        deploy_up(topology, topology_path)
        return target_from_deployment(topology.name)

    def down(self, deployment: str) -> None:
        from ucmctl.deploy.api import deploy_down

        deploy_down(deployment)


CellRunner = Callable[[WorkloadSpec, BenchConfig, Target], list[Cell]]


def run_suite(
    suite: Suite,
    topology: Topology,
    topology_path: str,
    results: ResultsFile,
    run_cell: CellRunner,
    deployer: Deployer,
    vocab: int,
    log: Callable[[str], None] = lambda _: None,
    cache_salt: str | None = None,
    fail_fast: bool = False,
) -> list[Cell]:
    """Run what the results file lacks; return every cell of the suite in matrix order. Every
    request carries `cache_salt`: no cell hits a block an earlier run of the suite stored. With
    `fail_fast`, a process of the deployment lost while a cell runs stops the suite at once (the
    scenario is taken down; the cells done so far stay in the results file for a rerun)."""
    scenario_topologies = {s: apply_scenario(topology, s, suite.side_flags) for s in suite.scenarios}
    from ucmctl.plan.build import build_plan

    for t in scenario_topologies.values():  # every scenario must plan before the first one starts
        build_plan(t)
    base = suite.bench_config(vocab)
    base.cache_salt = cache_salt
    base.fail_fast = fail_fast
    all_cells = suite.cells()
    lengths = suite.lengths()
    n_len, n_rep = len(lengths), suite.repeats
    for si, scenario in enumerate(suite.scenarios):
        todo = [c for c in all_cells if c[0] == scenario and c not in results.done]
        if not todo:
            log(f"{scenario}: all {n_len * n_rep} cells already done")
            continue
        log(f"{scenario}: deploying {topology.name} ({len(todo)} cells to run)")
        target = deployer.up(scenario_topologies[scenario], topology_path)
        try:
            for key in todo:
                _, input_len, repeat = key
                li = lengths.index(input_len)
                cfg = BenchConfig(**base.__dict__)
                # A stream of prompts of its own per cell, attempt and results file: a re-run never
                # hits the store entries that an interrupted or an earlier run left behind.
                cfg.stream_base = results.stream(si, li, repeat)
                cells = run_cell(suite.cell_spec([input_len] if input_len else []), cfg, target)
                for cell in cells:
                    cell.scenario, cell.repeat = scenario, repeat
                    cell.put("topology_digest", scenario_topologies[scenario].digest())
                results.record(key, cells)
                log(f"{scenario} {input_len or suite.kind}: done")
        finally:
            deployer.down(topology.name)
    return [cell for c in all_cells for cell in results.done[c]]
