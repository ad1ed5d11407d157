"""The results history: what a run leaves in it, what listing and trends read back, what its
key keeps apart, and the files it refuses without touching them."""

from __future__ import annotations

import hashlib
import json
import shutil
import sqlite3
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from rich.console import Console

from tests.unit.bench.helpers import cell, invoke
from tests.unit.plan.conftest import TOPOLOGIES
from ucmctl.bench import history, history_view
from ucmctl.bench.provenance import deployment_facts, provenance
from ucmctl.bench.report import document
from ucmctl.core.errors import UcmctlError
from ucmctl.plan.build import build_plan
from ucmctl.topology.load import load_topology

MADE_BEFORE = Path(__file__).parent / "data" / "made-before-typed"


def doc(ttfts: dict[int, float], *, salt: str = "s1", num_prompts: int = 8, **prov: Any) -> dict[str, Any]:
    cells = [cell(n, ttft, scenario="ucm") for n, ttft in ttfts.items()]
    cells[0]["measure"]["hit_rate"] = {"total": {"hit_rate": 0.79}, "by_role": {"prefill": {"hit_rate": 0.8}}}
    p = {**provenance(argv=["test"]), "cache_salt": salt, "topology_digest": "t1", **prov}
    return document(cells, {"num_prompts": num_prompts, "seed": 0, "cache_salt": salt}, p)


def test_runs_and_cells_read_back_as_recorded(tmp_path: Path) -> None:
    path = tmp_path / "h" / "history.sqlite"  # its folder made on the first run
    first = history.record(
        path, doc({1024: 100.0, 2048: 200.0}), command="suite", deployment="d1", label="nightly"
    )
    second = history.record(path, doc({1024: 110.0}, salt="s2"), command="bench", deployment="d1", label=None)
    assert (first, second) == (1, 2)
    runs = history.runs(path, history.Filter())
    assert [(r.id, r.command, r.deployment, r.workload, r.label, r.failed) for r in runs] == [
        (1, "suite", "d1", "prefix", "nightly", 0),
        (2, "bench", "d1", "prefix", None, 0),
    ]
    # another salt, the same workload and place: one key (the salt is the run's own)
    assert runs[0].provenance_key == runs[1].provenance_key
    rows = history.cells(path, [1, 2])
    assert [(c.run_id, c.cell, c.figures["ttft_mean"]) for c in rows] == [
        (1, "ucm/1024", 100.0),
        (1, "ucm/2048", 200.0),
        (2, "ucm/1024", 110.0),
    ]
    assert rows[0].figures["hit_rate"] == 0.8  # the first leg's, as the report reads it
    assert rows[1].figures["hit_rate"] is None
    assert history.document(path, 1)["cells"][1]["measure"]["mean_ttft_ms"] == 200.0
    with pytest.raises(UcmctlError, match="no run 3 in the results history"):
        history.document(path, 3)


def test_filters(tmp_path: Path) -> None:
    path = tmp_path / "history.sqlite"
    history.record(path, doc({1024: 1.0}), command="bench", deployment="a", label="nightly")
    history.record(path, doc({1024: 1.0}, num_prompts=16), command="bench", deployment="b", label="pr")
    history.record(path, doc({1024: 1.0}), command="bench", deployment="a", label="pr")
    ids = lambda **kw: [r.id for r in history.runs(path, history.Filter(**kw))]  # noqa: E731
    assert ids(deployment="a") == [1, 3]
    assert ids(label="pr") == [2, 3]
    assert ids(workload="prefix") == [1, 2, 3] and ids(workload="trace") == []
    assert ids(last=2) == [2, 3]
    assert ids(since=time.time() + 60) == []
    key = history.runs(path, history.Filter(deployment="b"))[0].provenance_key
    assert ids(key=key[:8]) == [2]  # another workload parameter: another key
    assert ids(key=history.runs(path, history.Filter())[0].provenance_key[:10]) == [1, 3]


def test_the_key_names_what_differs() -> None:
    a = history.key_fields(doc({1024: 1.0}, nodes={"n1": {"engine": "0.11.0", "torch": "2.8.0"}}))
    b = history.key_fields(doc({1024: 1.0}, nodes={"n1": {"engine": "0.11.1", "torch": "2.8.0"}}))
    assert {k for k in a if a[k] != b.get(k)} == {"engine@n1"}
    assert history.provenance_key(a) != history.provenance_key(b)
    assert "config.cache_salt" not in a and a["config.num_prompts"] == 8


def test_parse_since() -> None:
    assert history.parse_since("7d", now=1_000_000.0) == 1_000_000.0 - 7 * 86400
    assert history.parse_since("90m", now=10_000.0) == 10_000.0 - 5400
    assert history.parse_since("2026-12-01") == time.mktime(time.strptime("2026-12-01", "%Y-%m-%d"))
    with pytest.raises(UcmctlError, match="'yesterday' is not a time"):
        history.parse_since("yesterday")


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.parametrize("kind", ["text", "other-sqlite", "newer"])
def test_a_file_that_is_not_a_history_is_refused_and_left_as_it_was(tmp_path: Path, kind: str) -> None:
    path = tmp_path / "history.sqlite"
    if kind == "text":
        path.write_text("my notes\n")
        said = "is not a results history (not an SQLite file)"
    elif kind == "other-sqlite":
        with sqlite3.connect(path) as db:
            db.execute("CREATE TABLE t (x)")
        said = "is an SQLite file but not a results history of ucmctl"
    else:
        history.record(path, doc({1024: 1.0}), command="bench", deployment=None, label=None)
        with sqlite3.connect(path) as db:
            db.execute("UPDATE meta SET value = '9' WHERE key = 'schema_version'")
        said = "is a results history of a newer ucmctl (schema 9; this one reads 1)"
    before = _digest(path)
    with pytest.raises(UcmctlError, match=f"{path}: {said}".replace("(", r"\(").replace(")", r"\)")):
        history.check(path)
    with pytest.raises(UcmctlError):
        history.record(path, doc({1024: 1.0}), command="bench", deployment=None, label=None)
    code, text = invoke("history", "--history", str(path))
    assert code == 2 and said in " ".join(text.split()), text
    assert _digest(path) == before


def test_a_folder_and_a_missing_file() -> None:
    with pytest.raises(UcmctlError, match="is a folder, not a results history"):
        history.check(Path("/"))
    missing = Path("/nonexistent/history.sqlite")
    history.check(missing)  # nothing yet: a run will make it
    assert history.runs(missing, history.Filter()) == [] and not missing.exists()


def test_runs_appended_at_once_are_all_kept(tmp_path: Path) -> None:
    path = tmp_path / "history.sqlite"
    errors: list[BaseException] = []

    def append(i: int) -> None:
        try:
            for _ in range(10):
                history.record(path, doc({1024: float(i)}), command="bench", deployment=f"d{i}", label=None)
        except BaseException as exc:  # pragma: no cover - what the assertion reports
            errors.append(exc)

    threads = [threading.Thread(target=append, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    runs = history.runs(path, history.Filter(last=100))
    assert sorted(r.id for r in runs) == list(range(1, 41))
    assert {r.deployment: 0 for r in runs}.keys() == {"d0", "d1", "d2", "d3"}


def test_the_listing_and_trends_fit_80_columns(tmp_path: Path) -> None:
    path = tmp_path / "history.sqlite"
    for ttft in (100.0, 123456.7, 90.5):
        history.record(path, doc({1024: ttft, 65536: ttft}), command="suite",
                       deployment="a-long-deployment-name", label="nightly-main")  # fmt: skip
    runs = history.runs(path, history.Filter())
    console = Console(width=80, record=True, highlight=False)
    history_view.print_runs(runs, console)
    cells = history_view.by_cell(history.cells(path, [r.id for r in runs]), "ucm/1024")
    assert list(cells) == ["ucm/1024"]
    history_view.print_trends(runs, cells, console)
    text = console.export_text()
    assert max(len(line) for line in text.splitlines()) <= 80, text
    assert "a-long-deployment-name" in text and "trend of ucm/1024" in text
    assert "123456.7 / 123456.7" in " ".join(text.split()) and "80.0%" in text, text


def test_a_field_newer_than_the_history_keeps_its_plan_digests_at_its_default() -> None:
    """A stored baseline's plan digest holds across an upgrade that adds a field to the plan
    (StorePlan.pack_blocks): at its default the field is left out of the digest."""
    plan = build_plan(load_topology(TOPOLOGIES / "2p2d-centralized.yaml"))
    assert plan.store is not None and plan.store.pack_blocks == 1

    def digest(p: object) -> str:
        return deployment_facts(SimpleNamespace(plan=p, node_facts={}), "m", None)["plan_digest"]

    older = plan.model_dump(mode="json")  # what a record of the ucmctl before the field held
    del older["store"]["pack_blocks"]
    for node in older["nodes"].values():
        node.pop("slurm_node", None)
        node.pop("systemd", None)
    for process in older["processes"]:
        process.pop("proxy")  # the proxy's spec, newer too (its argv holds the same)
        if process["server"] is not None:
            assert process["server"].pop("kv_events_config") is None  # newer: no events published
    assert digest(plan) == hashlib.sha256(json.dumps(older, sort_keys=True).encode()).hexdigest()[:16]
    packed = plan.model_copy(update={"store": plan.store.model_copy(update={"pack_blocks": 4})})
    assert digest(packed) != digest(plan)


def test_a_run_of_another_workload_keys_as_before_without_the_prefix_parameters(tmp_path: Path) -> None:
    """The prefix workload's parameters left a run's config (they are its spec's): a run of
    another workload made now keys as those made before, which held the options' defaults."""
    path = tmp_path / "history.sqlite"
    shutil.copy(MADE_BEFORE / "history.sqlite", path)
    runs = history.runs(path, history.Filter(last=100))
    assert {r.workload for r in runs} == {"prefix", "multi-turn", "long-doc", "trace"}
    prefix_keys = ("input_lens", "prefix_ratio", "num_prompts", "reset_hbm", "repeats")
    for run in runs:
        doc = history.document(path, run.id)
        if run.workload != "prefix":  # as this version saves it
            doc["config"] = {k: v for k, v in doc["config"].items() if k not in prefix_keys}
        assert history.provenance_key(history.key_fields(doc)) == run.provenance_key, run.workload
    doc = history.document(path, runs[0].id)
    other = {**doc, "config": {**doc["config"], "num_prompts": 64}}  # a value that is not the default
    assert history.provenance_key(history.key_fields(other)) != runs[0].provenance_key
