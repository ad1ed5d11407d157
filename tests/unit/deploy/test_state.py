from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest

from ucmctl.core.errors import UcmctlError
from ucmctl.deploy.state import ProcessState, Record, StateStore, Status, endpoints
from ucmctl.plan.build import build_plan
from ucmctl.topology.load import load_topology
from ucmctl.topology.model import SlurmCluster

TOPOLOGY = Path(__file__).resolve().parents[3] / "topologies" / "2p2d-centralized.yaml"


def record() -> Record:
    plan = build_plan(load_topology(TOPOLOGY))
    processes = {p.name: ProcessState(name=p.name, node=p.node) for p in plan.processes}
    return Record(
        deployment=plan.deployment,
        topology_path=str(TOPOLOGY),
        topology_digest=plan.topology_digest,
        plan=plan,
        processes=processes,
    )


def test_parallel_saves_never_collide(tmp_path: Path) -> None:
    """Servers start in parallel threads, each saving the record when it learns its pgid."""
    store = StateStore(tmp_path)
    rec = record()
    errors: list[BaseException] = []

    def save_many(i: int) -> None:
        try:
            for n in range(50):
                rec.processes["prefill-0"].pgid = i * 1000 + n
                store.save(rec)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=save_many, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    loaded = store.load(rec.deployment)
    assert loaded is not None and loaded.plan == rec.plan
    assert [p.name for p in tmp_path.iterdir()] == ["2p2d-centralized.json"]  # no temp files left


def test_endpoints_and_bad_names(tmp_path: Path) -> None:
    store = StateStore(tmp_path)
    store.save(record())
    ep = endpoints("2p2d-centralized", store)
    assert ep.proxies == ["http://192.168.10.1:7805"]
    names = [(n, r) for n, r, _ in ep.instances]
    assert names == [
        ("prefill-0", "prefill"),
        ("prefill-1", "prefill"),
        ("decode-0", "decode"),
        ("decode-1", "decode"),
    ]
    with pytest.raises(UcmctlError, match="no deployment named 'nope'"):
        endpoints("nope", store)
    with pytest.raises(UcmctlError, match="is not a deployment name"):
        store.load("../../etc/passwd")


def _as_v1(rec: Record) -> dict:
    """The record as ucmctl wrote it before plan schema 2 (no health_timeout, bind, store)."""
    raw = rec.model_dump(mode="json")
    raw["schema_version"] = 1
    plan = raw["plan"]
    plan["schema_version"] = 1
    del plan["store"], plan["cluster"]
    for p in plan["processes"]:
        del p["health_timeout"]
    for n in plan["nodes"].values():
        del n["bind"]
    return raw


def _as_v2(rec: Record) -> dict:
    """The record as ucmctl wrote it before plan schema 3 (`slurm`, None over SSH, not `cluster`)."""
    raw = rec.model_dump(mode="json")
    raw["schema_version"] = 2
    plan = raw["plan"]
    plan["schema_version"] = 2
    cluster = plan.pop("cluster")
    plan["slurm"] = cluster if cluster["kind"] == "slurm" else None
    return raw


@pytest.mark.parametrize("cluster", [None, SlurmCluster(kind="slurm", partition="gpu", gres="gpu")])
def test_a_record_of_schema_2_is_upgraded(tmp_path: Path, cluster: SlurmCluster | None) -> None:
    rec = record()
    if cluster is not None:
        topology = load_topology(TOPOLOGY).model_copy(update={"cluster": cluster})
        rec = rec.model_copy(update={"plan": build_plan(topology)})
    store = StateStore(tmp_path)
    store.path(rec.deployment).write_text(json.dumps(_as_v2(rec)))
    loaded = store.load(rec.deployment)
    assert loaded is not None and loaded.schema_version == 3 and loaded.plan.schema_version == 3
    assert loaded.plan == rec.plan
    assert loaded.plan.cluster.kind == ("slurm" if cluster else "ssh")


def test_a_record_of_schema_1_is_upgraded_from_what_its_plan_held(tmp_path: Path) -> None:
    rec = record()
    store = StateStore(tmp_path)
    store.path(rec.deployment).write_text(json.dumps(_as_v1(rec)))
    loaded = store.load(rec.deployment)
    assert loaded is not None and loaded.schema_version == 3
    assert loaded.plan == rec.plan  # timeouts, binds and the store, as planning decides them now


def test_a_record_of_an_unknown_schema_is_refused_in_one_line(tmp_path: Path) -> None:
    rec = record()
    store = StateStore(tmp_path)
    store.path(rec.deployment).write_text(json.dumps({**rec.model_dump(mode="json"), "schema_version": 7}))
    with pytest.raises(UcmctlError) as caught:
        store.load(rec.deployment)
    assert "schema version 7" in str(caught.value)
    assert "\n" not in str(caught.value).strip()


# A record as ucmctl wrote it while `status` was a plain string (its plan spliced in: the plan's
# own schema is tested above).
RECORD_OF_A_PLAIN_STATUS = """{"schema_version": 3, "deployment": "2p2d-centralized",
 "topology_path": "topologies/2p2d-centralized.yaml", "topology_digest": "3f2a9c",
 "created_at": 1733000000.5, "status": "%s", "plan": null,
 "processes": {"prefill-0": {"name": "prefill-0", "node": "a", "pgid": 4711, "started_at": 1733000001.25,
  "restarts": 1}},
 "kv_probe": null, "allocation": null, "node_facts": {}}"""


@pytest.mark.parametrize("word", ["starting", "up", "failed", "stopped"])
def test_a_record_s_status_loads_as_its_enum_and_is_written_as_the_same_word(
    tmp_path: Path, word: str
) -> None:
    raw = json.loads(RECORD_OF_A_PLAIN_STATUS % word)
    raw["plan"] = record().plan.model_dump(mode="json")
    store = StateStore(tmp_path)
    written = json.dumps(raw, indent=1)  # as `save` writes a record
    store.path("2p2d-centralized").write_text(written)
    loaded = store.load("2p2d-centralized")
    assert loaded is not None and loaded.status is Status(word) and loaded.status == word
    assert f"{loaded.status}" == word  # how messages and the status table's title say it
    store.save(loaded)
    assert store.path("2p2d-centralized").read_text() == written


def test_a_new_record_is_starting() -> None:
    assert record().status is Status.starting
    assert record().model_dump(mode="json")["status"] == "starting"
