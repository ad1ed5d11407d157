"""The saved result's typed record: results and a history made by the ucmctl before the typed
records (data/made-before-typed/: `ucmctl bench --save` and its history, one run per workload,
against the simulator) and the stored baselines read as typed cells and phases and dump back
to the values they had, their keys in the same order; version 1 results read as prefix; an
unknown version is refused."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from ucmctl.bench import history
from ucmctl.bench.results import Cell, Phase, Record, read_record

DATA = Path(__file__).parent / "data" / "made-before-typed"
BASELINES = Path(__file__).resolve().parents[3] / "benchmarks" / "baselines"


def _kept(doc: dict[str, Any]) -> Record:
    record = read_record(doc)
    assert record.document() == doc
    assert json.dumps(record.document(), indent=1) == json.dumps(doc, indent=1)  # key order; ints stay ints
    return record


@pytest.mark.parametrize("path", sorted(BASELINES.glob("*.json")), ids=lambda p: p.name)
def test_a_stored_baseline_reads_as_a_typed_record(path: Path) -> None:
    doc = json.loads(path.read_text())
    record = _kept(doc)
    assert len(record.cells) == len(doc["cells"]) > 0
    for cell, raw in zip(record.cells, doc["cells"], strict=True):
        assert isinstance(cell.measure, Phase)
        assert cell.measure.completed == raw["measure"]["completed"]
        assert cell.measure.mean_ttft_ms == raw["measure"]["mean_ttft_ms"]
        assert cell.scenario == raw["scenario"] and cell.workload == raw.get("workload", "prefix")


@pytest.mark.parametrize("workload", ["prefix", "multi-turn", "long-doc", "trace"])
def test_a_result_saved_before_reads_as_a_typed_record(workload: str) -> None:
    doc = json.loads((DATA / f"{workload}.json").read_text())
    record = _kept(doc)
    assert {c.workload for c in record.cells} == {workload}
    assert sum(c.primary for c in record.cells) >= 1
    first = record.cells[0]
    assert first.measure is not None and first.measure.failed == 0
    rates = doc["cells"][0]["measure"]["hit_rate"]
    assert first.measure.hit_rate is not None and first.measure.hit_rate.document() == rates
    by_role = rates["by_role"]
    leg = by_role.get("prefill") or by_role.get("mixed") or rates["total"]
    assert first.measure.first_leg() == leg["hit_rate"] is not None
    assert first.stream == doc["cells"][0]["stream"]
    newer = Cell.model_validate({**doc["cells"][0], "a_newer_key": [1]})  # kept as it is
    assert newer.model_extra == {"a_newer_key": [1]} and newer.document()["a_newer_key"] == [1]


def test_a_history_made_before_reads_each_run_as_a_typed_record(tmp_path: Path) -> None:
    path = tmp_path / "history.sqlite"
    shutil.copy(DATA / "history.sqlite", path)
    found = history.runs(path, history.Filter(last=100))
    assert len(found) == 7
    kinds = set()
    for run in found:
        record = _kept(history.document(path, run.id))
        kinds |= {c.workload for c in record.cells}
    assert kinds == {"prefix", "multi-turn", "long-doc", "trace"}
    aggregate = [c for r in found for c in read_record(history.document(path, r.id)).cells if c.aggregate]
    assert [c.label for c in aggregate] == ["rounds 2-2"]  # multi-turn's later rounds together


def test_a_version_1_result_reads_as_the_prefix_workload() -> None:
    doc = json.loads((DATA / "prefix.json").read_text())
    doc["schema_version"] = 1
    for cell in doc["cells"]:
        del cell["workload"], cell["label"]
    record = _kept(doc)
    assert [c.workload for c in record.cells] == ["prefix", "prefix"]
    assert all(c.label is None for c in record.cells)


def test_an_unknown_version_or_kind_is_refused() -> None:
    doc = json.loads((DATA / "trace.json").read_text())
    with pytest.raises(ValidationError, match="schema_version 3 is not 2"):
        read_record({**doc, "schema_version": 3})
    with pytest.raises(ValidationError):
        read_record({**doc, "kind": "ucmctl-bench-history"})
