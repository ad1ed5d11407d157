"""What the commands share (commands/shared.py): a deployment named or left out, a process
named where the deployment may be, and the plan of a recorded deployment."""

from __future__ import annotations

from pathlib import Path

import pytest

from ucmctl.commands.shared import deployment_and_processes, is_name, running_plan
from ucmctl.core.errors import UcmctlError
from ucmctl.deploy.state import Record, StateStore
from ucmctl.plan.build import build_plan
from ucmctl.topology.load import load_topology

TOPOLOGY = Path(__file__).resolve().parents[3] / "topologies" / "2p2d-centralized.yaml"


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> StateStore:
    monkeypatch.setenv("UCMCTL_HOME", str(tmp_path / "home"))
    return StateStore()


def _record(store: StateStore, name: str) -> Record:
    plan = build_plan(load_topology(TOPOLOGY))
    record = Record(
        deployment=name,
        topology_path=str(TOPOLOGY),
        topology_digest=plan.topology_digest,
        plan=plan,
        status="up",
    )
    store.save(record)
    return record


def test_names_and_paths() -> None:
    assert is_name("alpha") and is_name("prefill-0")
    assert not is_name("a/b") and not is_name("")


def test_the_plan_of_a_recorded_deployment_and_of_no_file(home: StateStore, tmp_path: Path) -> None:
    record = _record(home, "alpha")
    plan = running_plan(Path("alpha"))
    assert plan is not None and plan.deployment == record.plan.deployment
    assert running_plan(Path("beta")) is None  # no such deployment
    assert running_plan(TOPOLOGY) is None  # a file: the caller loads it
    assert running_plan(Path("sub/alpha")) is None  # a path, even where no file is


def test_a_process_of_the_only_deployment_may_stand_for_the_deployment(home: StateStore) -> None:
    _record(home, "alpha")
    record, names = deployment_and_processes("logs", "prefill-0", ["decode-1"])
    assert record.deployment == "alpha" and names == ["prefill-0", "decode-1"]
    record, names = deployment_and_processes("logs", "alpha", None)
    assert record.deployment == "alpha" and names == []
    with pytest.raises(UcmctlError, match="'nope' is neither a deployment on this machine nor a process"):
        deployment_and_processes("logs", "nope", None)
    with pytest.raises(UcmctlError, match="no process nope in alpha"):
        deployment_and_processes("logs", "alpha", ["nope"])


def test_with_two_deployments_the_name_must_be_one(home: StateStore) -> None:
    _record(home, "alpha")
    _record(home, "beta")
    with pytest.raises(UcmctlError, match="no deployment named 'gamma' on this machine"):
        deployment_and_processes("restart", "gamma", None)
    record, _ = deployment_and_processes("restart", "beta", None)
    assert record.deployment == "beta"
