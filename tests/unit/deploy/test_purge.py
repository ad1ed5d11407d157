"""`purge` works from a Plan alone (a deployment record's), deleting only the store's folders."""

from __future__ import annotations

from pathlib import Path

import pytest

from ucmctl.core.errors import UcmctlError
from ucmctl.deploy.api import purge
from ucmctl.plan.build import build_plan
from ucmctl.topology.load import load_topology

TOPOLOGY = Path(__file__).resolve().parents[3] / "topologies" / "local-1p1d.yaml"


def test_purge_reads_the_plan_and_deletes_only_the_store_folders(tmp_path: Path) -> None:
    plan = build_plan(load_topology(TOPOLOGY))
    assert plan.store is not None
    backends = [tmp_path / "a", tmp_path / "b"]
    plan = plan.model_copy(
        update={"store": plan.store.model_copy(update={"backends": list(map(str, backends))})}
    )
    for b in backends:
        for d in ("0a1", "fff", "corrupt", "keep", "0a"):
            (b / d).mkdir(parents=True)
        (b / "note").write_text("stays")
    assert purge(plan) == 6
    for b in backends:
        assert sorted(p.name for p in b.iterdir()) == ["0a", "keep", "note"]


def test_purge_without_a_store_says_so() -> None:
    plan = build_plan(load_topology(TOPOLOGY))
    with pytest.raises(UcmctlError, match="has no storage to purge"):
        purge(plan.model_copy(update={"store": None}))
