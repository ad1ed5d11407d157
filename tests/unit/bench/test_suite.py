"""Suites: the scenario overrides, the matrix, resuming after an interruption, the table."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from ucmctl.bench.report import markdown
from ucmctl.bench.results import Cell, cells_of
from ucmctl.bench.runner import BenchConfig, Target
from ucmctl.bench.suite import ResultsFile, Suite, apply_scenario, load_suite, run_suite
from ucmctl.bench.workloads import PrefixSpec, WorkloadSpec
from ucmctl.core.errors import UcmctlError
from ucmctl.plan.build import build_plan
from ucmctl.topology.load import load_topology
from ucmctl.topology.model import Topology

from .helpers import measure

ROOT = Path(__file__).resolve().parents[3]
EP = ROOT / "topologies" / "ep-dp4tp8-dp8tp4.yaml"
CI_SUITE = ROOT / "benchmarks" / "suites" / "ci.yaml"


def _argv(t: Topology, role: str) -> str:
    return " ".join(next(p for p in build_plan(t).processes if p.role == role).argv)


def test_scenarios_override_the_topology() -> None:
    t = load_topology(EP)
    recompute, hbm, ucm = (
        apply_scenario(t, s, {"max-model-len": 133120}) for s in ("recompute", "hbm", "ucm")
    )
    assert recompute.storage is None and hbm.storage is None and ucm.storage == t.storage
    assert "--no-enable-prefix-caching" in _argv(recompute, "prefill")
    assert "--no-enable-prefix-caching" in _argv(recompute, "decode")
    assert "prefix-caching" not in _argv(hbm, "prefill")
    assert "UCMConnector" in _argv(ucm, "prefill") and "UCMConnector" not in _argv(hbm, "prefill")
    assert "--max-model-len 133120" in _argv(hbm, "decode")
    digests = {t.digest(), recompute.digest(), hbm.digest(), ucm.digest()}
    assert len(digests) == 4  # each scenario has its own provenance digest
    assert t.digest() == load_topology(EP).digest()  # the original is untouched


def test_shipped_suites_load_and_plan() -> None:
    ep = load_suite(ROOT / "benchmarks" / "suites" / "ep-guide.yaml")
    assert ep.input_lens == [32768, 65536, 131072] and ep.scenarios == ["recompute", "hbm", "ucm"]
    assert (ep.num_prompts, ep.concurrency, ep.prefix_ratio, ep.output_len) == (128, 128, 0.8, 1000)
    assert (ROOT / "benchmarks" / "suites" / ep.topology).resolve() == EP
    ci = load_suite(CI_SUITE)
    topo = load_topology(CI_SUITE.parent / ci.topology)
    assert topo.engine.value == "sim"
    for s in ci.scenarios:
        build_plan(apply_scenario(topo, s))


class FakeDeployer:
    def __init__(self) -> None:
        self.events: list[str] = []
        self.digests: list[str] = []

    def up(self, topology: Topology, topology_path: str) -> Target:
        self.events.append(f"up:{'ucm' if topology.storage else 'nostore'}")
        self.digests.append(topology.digest())
        return Target("http://sim")

    def down(self, deployment: str) -> None:
        self.events.append(f"down:{deployment}")


class Interrupt(Exception):
    pass


def _suite(**kw: Any) -> Suite:
    data = {
        "name": "t",
        "topology": "x.yaml",
        "input_lens": [100, 200],
        "num_prompts": 2,
        "concurrency": 2,
        "output_len": 4,
        **kw,
    }
    return Suite.model_validate(data)


def test_matrix_resume_and_table(tmp_path: Path) -> None:
    suite = _suite()
    topo = load_topology(EP)
    calls: list[tuple[int, int]] = []

    def runner(fail_after: int | None) -> Any:
        def run_cell(spec: WorkloadSpec, cfg: BenchConfig, target: Target) -> list[Cell]:
            if fail_after is not None and len(calls) >= fail_after:
                raise Interrupt()
            assert isinstance(spec, PrefixSpec) and len(spec.input_lens) == 1
            calls.append((spec.input_lens[0], cfg.stream_base))
            assert target.url == "http://sim" and spec.repeats == 1 and spec.num_prompts == 2
            ttft = {100: 10.0, 200: 20.0}[spec.input_lens[0]] * (1 + len(calls))
            return cells_of(
                [{"input_len": spec.input_lens[0], "repeat": 0, "prefix_ratio": 0.8, "preseed": None,
                  "measure": measure(ttft)}]
            )  # fmt: skip

        return run_cell

    results = ResultsFile(tmp_path / "r.jsonl", suite)
    results.open(fresh=False)
    deployer = FakeDeployer()
    with pytest.raises(Interrupt):
        run_suite(suite, topo, str(EP), results, runner(fail_after=3), deployer, 8000)
    # recompute (2 cells) finished, hbm's first cell finished, then the interruption: still taken down
    assert deployer.events == ["up:nostore", "down:ep-dp4tp8-dp8tp4", "up:nostore", "down:ep-dp4tp8-dp8tp4"]
    assert len(calls) == 3

    again = ResultsFile(tmp_path / "r.jsonl", suite)
    again.open(fresh=False)
    assert again.attempt == 1 and len(again.done) == 3
    deployer2 = FakeDeployer()
    cells = run_suite(suite, topo, str(EP), again, runner(fail_after=None), deployer2, 8000)
    assert len(calls) == 6  # only the three missing cells ran
    assert deployer2.events == ["up:nostore", "down:ep-dp4tp8-dp8tp4", "up:ucm", "down:ep-dp4tp8-dp8tp4"]
    assert [(c.scenario, c.input_len) for c in cells] == [
        ("recompute", 100),
        ("recompute", 200),
        ("hbm", 100),
        ("hbm", 200),
        ("ucm", 100),
        ("ucm", 200),
    ]
    assert len({s for _, s in calls}) == 6  # every cell, every attempt: a prompt stream of its own
    table = markdown(cells)
    assert table.splitlines()[0].startswith("| input | output | recompute TTFT / TPOT / E2EL (ms) | hbm TTFT")
    assert "| 100 | 100 | 20.00 / 10.00 / 1000 | 40.00 / 10.00 / 1000 | 60.00 / 10.00 / 1000 |" in table

    changed = ResultsFile(tmp_path / "r.jsonl", _suite(output_len=8))
    with pytest.raises(UcmctlError, match="different version of the suite"):
        changed.open(fresh=False)
    changed.open(fresh=True)
    assert changed.done == {} and changed.attempt == 0


def test_fail_fast_reaches_every_cell_and_a_loss_takes_the_scenario_down(tmp_path: Path) -> None:
    seen: list[bool] = []

    def run_cell(spec: WorkloadSpec, cfg: BenchConfig, target: Target) -> list[Cell]:
        seen.append(cfg.fail_fast)
        raise UcmctlError.one("stopped at once (--fail-fast): LOST decode-0 on n2: not running")

    results = ResultsFile(tmp_path / "r.jsonl", _suite())
    results.open(fresh=False)
    deployer = FakeDeployer()
    with pytest.raises(UcmctlError, match="stopped at once"):
        run_suite(_suite(), load_topology(EP), str(EP), results, run_cell, deployer, 8000, fail_fast=True)
    assert seen == [True] and deployer.events == ["up:nostore", "down:ep-dp4tp8-dp8tp4"]


def test_cut_last_line_is_run_again(tmp_path: Path) -> None:
    suite = _suite()
    results = ResultsFile(tmp_path / "r.jsonl", suite)
    results.open(fresh=False)
    results.record(("recompute", 100, 0), cells_of([{"input_len": 100, "measure": measure(1.0)}]))
    with (tmp_path / "r.jsonl").open("a") as f:
        f.write('{"type":"cell","scenario":"recompute","input_len":200,"rep')  # killed mid-write
    again = ResultsFile(tmp_path / "r.jsonl", suite)
    again.open(fresh=False)
    assert set(again.done) == {("recompute", 100, 0)}


def test_bad_suite_file(tmp_path: Path) -> None:
    f = tmp_path / "s.yaml"
    f.write_text("name: x\ntopology: t.yaml\ninput_lens: [1]\nscenarios: [warp]\n")
    with pytest.raises(UcmctlError, match="scenarios"):
        load_suite(f)
