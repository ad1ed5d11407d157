"""The digests' one table of fields newer than the records: each left out at its default, the
defaults the models' own, and digests of records made before each field unchanged."""

from __future__ import annotations

from typing import Any

from ucmctl.topology.container import Container
from ucmctl.topology.digest_compat import ALWAYS, BARE, FIELDS, NEVER, without_newer
from ucmctl.topology.fields import Restart


def test_the_tables_defaults_are_the_models_defaults() -> None:
    assert Container.model_validate({}).model_dump(mode="json") == BARE
    assert Restart().model_dump(mode="json") == NEVER
    assert {f.record for f in FIELDS} == {"topology", "plan", "suite"}


def test_a_field_at_its_default_is_left_out_any_other_value_kept() -> None:
    data: dict[str, Any] = {
        "nodes": {"a": {"container": dict(BARE), "systemd": False}, "b": {"container": {"runtime": "podman"},
                  "systemd": True}},
        "prefill": {"container": None, "restart": dict(NEVER)},
        "decode": None,
        "proxy": {"restart": {**NEVER, "policy": "on-failure"}},
        "storage": {"pack_blocks": 1, "backends": []},
    }  # fmt: skip
    assert without_newer("topology", data) is data
    assert data == {
        "nodes": {"a": {}, "b": {"container": {"runtime": "podman"}, "systemd": True}},
        "prefill": {},
        "decode": None,
        "proxy": {"restart": {**NEVER, "policy": "on-failure"}},
        "storage": {"backends": []},
    }


def test_a_plan_leaves_out_where_it_ran_always_and_the_newer_fields_at_their_defaults() -> None:
    data: dict[str, Any] = {
        "nodes": {"n1": {"slurm_node": "c7", "systemd": False}, "n2": {"slurm_node": None, "systemd": True}},
        "processes": [{"restart": {"by": "supervisor", "script": None}}, {"restart": None},
                      {"restart": {"by": "systemd", "script": "unit.sh"}}],
        "store": {"pack_blocks": 4},
    }  # fmt: skip
    without_newer("plan", data)
    assert data == {
        "nodes": {"n1": {}, "n2": {"systemd": True}},
        "processes": [{"restart": {"by": "supervisor"}}, {"restart": None},
                      {"restart": {"by": "systemd", "script": "unit.sh"}}],
        "store": {"pack_blocks": 4},
    }  # fmt: skip
    assert repr(ALWAYS) == "ALWAYS"


def test_a_suite_without_a_workload_leaves_it_out() -> None:
    assert without_newer("suite", {"name": "s", "workload": None}) == {"name": "s"}
    kept = {"name": "s", "workload": {"kind": "trace"}}
    assert without_newer("suite", dict(kept)) == kept
