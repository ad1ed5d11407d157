"""The launcher seam without a scheduler: which launcher a plan gets, what a Slurm topology
may say, the commands the Slurm launcher would run, and records that carry an allocation."""

from __future__ import annotations

import io
import json
import time
from pathlib import Path

import pytest
from rich.console import Console

from ucmctl.core.errors import UcmctlError
from ucmctl.deploy.health import HEALTHY, UNKNOWN
from ucmctl.deploy.inspect import Look, render_status
from ucmctl.deploy.state import Record, StateStore
from ucmctl.launch import Allocation, launcher_for
from ucmctl.launch.nodes import NodeLauncher
from ucmctl.launch.slurm import SlurmLauncher, StepExecutor, srun_refusal
from ucmctl.nodes.run_state import Kind, RunState
from ucmctl.plan.build import build_plan
from ucmctl.plan.model import SlurmPlan
from ucmctl.topology.load import load_topology

SLURM = """
name: s-unit
mode: centralized
engine: sim
model: {{path: sim-model}}
cluster: {cluster}
nodes:
  gpu-a01: {{host: 10.0.0.11, platform: cpu, workdir: /shared/run}}
  gpu-a02: {{host: 10.0.0.12, platform: cpu, workdir: /shared/run}}
prefill: {{nodes: [gpu-a01], port: 8100}}
decode: {{nodes: [gpu-a02], port: 8200}}
proxy: {{node: gpu-a01, port: 8000}}
"""


def plan_of(tmp_path: Path, cluster: str = "{kind: slurm, partition: gpu, account: llm, time_limit: 90}"):  # type: ignore[no-untyped-def]
    path = tmp_path / "t.yaml"
    path.write_text(SLURM.format(cluster=cluster))
    return build_plan(load_topology(path))


def test_a_slurm_topology_plans_a_slurm_allocation(tmp_path: Path) -> None:
    plan = plan_of(tmp_path)
    spec = plan.cluster
    assert isinstance(spec, SlurmPlan) and spec.kind == "slurm"
    assert (spec.partition, spec.account, spec.time_limit) == ("gpu", "llm", "90")
    assert spec.wait_allocation == 300
    assert spec.job_name(plan.deployment) == "ucmctl-s-unit"
    assert {n.transport for n in plan.nodes.values()} == {"slurm"}
    assert isinstance(launcher_for(plan), SlurmLauncher)


def test_without_a_cluster_section_the_nodes_are_reached_over_ssh(tmp_path: Path) -> None:
    plan = plan_of(tmp_path, "{kind: ssh}")
    assert plan.cluster.kind == "ssh" and {n.transport for n in plan.nodes.values()} == {"ssh"}
    assert isinstance(launcher_for(plan), NodeLauncher)


@pytest.mark.parametrize("limit", ["30", "30:00", "1:00:00", "2-12", "2-12:30", "2-12:30:00", "UNLIMITED"])
def test_slurm_time_formats_are_accepted(tmp_path: Path, limit: str) -> None:
    spec = plan_of(tmp_path, f'{{kind: slurm, time_limit: "{limit}"}}').cluster
    assert isinstance(spec, SlurmPlan) and spec.time_limit == limit


@pytest.mark.parametrize(
    ("cluster", "said"),
    [
        ('{kind: slurm, time_limit: "1h"}', "time_limit: is not a Slurm time limit"),
        ('{kind: slurm, time_limit: "1:2:3:4"}', "time_limit: is not a Slurm time limit"),
        ("{kind: slurm, partition: 'gpu; rm -rf /'}", "cluster.slurm.partition"),
        ("{kind: pbs}", "cluster"),
        ("{kind: slurm, wait_allocation: 0}", "wait_allocation"),
        ("{kind: slurm, nodelist: x}", "nodelist"),
    ],
)
def test_bad_cluster_sections_are_one_line_each(tmp_path: Path, cluster: str, said: str) -> None:
    path = tmp_path / "t.yaml"
    path.write_text(SLURM.format(cluster=cluster))
    with pytest.raises(UcmctlError) as err:
        load_topology(path)
    lines = str(err.value).splitlines()
    assert len(err.value.problems) == 1, lines
    assert said in str(err.value) and f"{path}:6" in str(err.value), str(err.value)


def test_a_local_node_cannot_be_a_slurm_node(tmp_path: Path) -> None:
    path = tmp_path / "t.yaml"
    path.write_text(SLURM.format(cluster="{kind: slurm}").replace(
        "gpu-a01: {host: 10.0.0.11,", "gpu-a01: {host: 127.0.0.1, transport: local,"))  # fmt: skip
    with pytest.raises(UcmctlError) as err:
        load_topology(path)
    assert "a Slurm deployment runs every process as a job step" in str(err.value)


def test_steps_run_inside_the_allocation_on_their_node(tmp_path: Path) -> None:
    plan = plan_of(tmp_path)
    ex = StepExecutor(plan.nodes["gpu-a02"], "4711")
    argv = ex.argv("echo hi", name="decode-0")
    assert argv[:3] == ["srun", "--jobid=4711", "--overlap"]
    assert "--nodelist=gpu-a02" in argv and "--nodes=1" in argv and "--ntasks=1" in argv
    assert "--job-name=decode-0" in argv and argv[-3:] == ["/bin/sh", "-c", "echo hi"]
    # only a login's worth of this machine's environment reaches the node, no tokens
    assert "--export=PATH,HOME,USER,LOGNAME,LANG,LC_ALL,TZ" in argv


def test_without_an_allocation_a_command_is_a_small_job_of_its_own(tmp_path: Path) -> None:
    plan = plan_of(tmp_path)
    ex = SlurmLauncher(plan).standalone("gpu-a01")
    assert isinstance(ex, StepExecutor)
    argv = ex.argv("rm -rf x")
    assert "--overlap" not in argv and not any(a.startswith("--jobid") for a in argv)
    assert {"--partition=gpu", "--account=llm", "--time=10", "--nodelist=gpu-a01"} <= set(argv)


@pytest.mark.parametrize(
    ("stderr", "refused"),
    [
        ("srun: error: h2: task 0: Exited with exit code 1\n", None),
        ("srun: error: h2: task 0: Killed\n", None),
        ("srun: error: h2: task 0: Terminated\n", None),
        ("srun: error: Unable to create step for job 12: Invalid job id specified\n",
         "Unable to create step for job 12: Invalid job id specified"),
        ("srun: error: Task launch for StepId=12.3 failed on node h2: Communication connection failure\n"
         "srun: error: Application launch failed: Communication connection failure\n",
         "Task launch for StepId=12.3 failed on node h2: Communication connection failure"),
        ("some output of the command\n", None),
    ],
)  # fmt: skip
def test_sruns_own_errors_are_told_from_the_commands_exit(stderr: str, refused: str | None) -> None:
    assert srun_refusal(stderr) == refused


def test_a_record_keeps_its_allocation_and_older_records_still_load(tmp_path: Path) -> None:
    plan = plan_of(tmp_path)
    store = StateStore(tmp_path / "home")
    allocation = Allocation(kind="slurm", job_name="ucmctl-s-unit", job_id="4711")
    store.save(Record(deployment=plan.deployment, topology_path="t.yaml", topology_digest="d", plan=plan,
                      allocation=allocation))  # fmt: skip
    loaded = store.load(plan.deployment)
    assert loaded is not None and loaded.allocation == allocation
    raw = json.loads(store.path(plan.deployment).read_text())
    del raw["allocation"]  # a record written before launchers had allocations
    store.path(plan.deployment).write_text(json.dumps(raw))
    assert store.load(plan.deployment).allocation is None  # type: ignore[union-attr]


def test_status_shows_the_schedulers_lines_under_the_table_at_80_columns(tmp_path: Path) -> None:
    plan = plan_of(tmp_path)
    record = Record(deployment=plan.deployment, topology_path="t.yaml", topology_digest="d", plan=plan)
    up, unreachable = Look(RunState.up(), HEALTHY), Look(RunState(Kind.unreachable), UNKNOWN)
    looks = [up, unreachable, up]
    lines = ["Slurm job 4711 (ucmctl-s-unit): running",
             "node gpu-a02: idle* (slurmd not responding: its processes may be lost)"]  # fmt: skip
    out = io.StringIO()
    console = Console(file=out, width=80, color_system=None)
    for table in render_status(record, looks, time.time(), 80, lines):
        console.print(table)
    text = out.getvalue()
    assert max(len(line) for line in text.splitlines()) <= 80
    assert "Slurm job 4711 (ucmctl-s-unit): running" in text
    assert "gpu-a02: idle*" in " ".join(text.split())
    assert "node unreachable" in text


def test_nodes_slurm_chooses_have_no_host_until_bound(tmp_path: Path) -> None:
    text = SLURM.format(cluster="{kind: slurm, choose_nodes: true}")
    path = tmp_path / "t.yaml"
    path.write_text(text.replace("host: 10.0.0.11, ", "").replace("host: 10.0.0.12, ", ""))
    topology = load_topology(path)
    unbound = build_plan(topology)
    assert isinstance(unbound.cluster, SlurmPlan) and unbound.cluster.choose_nodes
    assert {n.slurm_node for n in unbound.nodes.values()} == {None}
    bound = build_plan(topology, {"gpu-a01": ("n17", "10.1.0.17"), "gpu-a02": ("n03", "10.1.0.3")})
    assert (bound.nodes["gpu-a01"].slurm_node, bound.nodes["gpu-a01"].host) == ("n17", "10.1.0.17")
    assert bound.process("proxy").url == "http://10.1.0.17:8000"
    assert "10.1.0.3" in " ".join(bound.process("decode-0").argv)  # it binds Slurm's address
    assert StepExecutor(bound.nodes["gpu-a02"], "9").argv("true")[3] == "--nodelist=n03"


@pytest.mark.parametrize(
    ("cluster", "drop_host", "said"),
    [
        ("{kind: slurm, choose_nodes: true}", False, "nodes.gpu-a01.host: Slurm chooses this node"),
        ("{kind: slurm}", True, "nodes.gpu-a01: the node has no `host`"),
        ("{kind: ssh}", True, "nodes.gpu-a01: the node has no `host`"),
    ],
)
def test_host_is_given_exactly_when_slurm_does_not_choose(
    tmp_path: Path, cluster: str, drop_host: bool, said: str
) -> None:
    text = SLURM.format(cluster=cluster)
    path = tmp_path / "t.yaml"
    path.write_text(text.replace("host: 10.0.0.11, ", "") if drop_host else text)
    with pytest.raises(UcmctlError) as err:
        load_topology(path)
    assert said in str(err.value), str(err.value)


def test_a_script_cannot_be_rendered_for_nodes_slurm_has_not_chosen_yet(tmp_path: Path) -> None:
    from ucmctl.launch.sbatch import render_script

    text = SLURM.format(cluster="{kind: slurm, choose_nodes: true}")
    path = tmp_path / "t.yaml"
    path.write_text(text.replace("host: 10.0.0.11, ", "").replace("host: 10.0.0.12, ", ""))
    with pytest.raises(UcmctlError) as err:
        render_script(build_plan(load_topology(path)))
    assert "needs the nodes named" in str(err.value)


def test_the_registry_has_a_launcher_for_every_cluster_kind_of_the_topology() -> None:
    from typing import get_args

    from ucmctl.launch import LAUNCHERS
    from ucmctl.plan.model import Plan
    from ucmctl.topology.model import Topology

    def kinds(model: type) -> set[str]:
        union = model.model_fields["cluster"].annotation  # type: ignore[attr-defined]
        return {get_args(c.model_fields["kind"].annotation)[0] for c in get_args(union)}

    assert kinds(Topology) == kinds(Plan) == set(LAUNCHERS) == {"ssh", "slurm"}
