"""`ucmctl up / status / logs / down` through a real Slurm (slurmctld, one slurmd per network
namespace host, munge), on the simulator: each process a job step in one allocation; `down`
leaves no process and no job, whatever happened before it."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from tests.support.cli import Cli
from tests.support.http import completion, metrics
from tests.support.processes import wait_for
from tests.support.slurm import Site
from tests.support.slurm_topology import centralized, queued
from tests.support.topology import write

pytestmark = [pytest.mark.slow, pytest.mark.root]


def external_hits(url: str) -> float:
    text = metrics(url)
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("vllm:external_prefix_cache_hits_total"))  # fmt: skip


def routed(proxy: str) -> list[str]:
    """The decode upstreams the proxy routes to."""
    with urllib.request.urlopen(f"{proxy}/instances", timeout=10) as r:
        listed = json.loads(r.read())
    return sorted(i["url"] for i in listed["instances"] if i["role"] == "decode")


def left(site: Site, name: str) -> tuple[list[tuple[str, int]], list[str]]:
    """What is left of deployment `name`: its marked processes on the hosts, and Slurm's jobs."""
    return site.hosts.processes_of(name), queued(site)


def test_2p2d_as_job_steps_of_one_allocation(tmp_path: Path, site: Site, cli: Cli) -> None:
    topo = write(tmp_path, centralized(site, "s-2p2d", per_node=2))
    up = cli("up", str(topo))
    assert up.returncode == 0, up.stderr
    assert "deployment s-2p2d is up: 5 processes" in up.stdout
    record = json.loads((tmp_path / "home" / "deployments" / "s-2p2d.json").read_text())
    job = record["allocation"]["job_id"]
    assert record["allocation"]["job_name"] == "ucmctl-s-2p2d" and job in queued(site)
    # Every process is a step of that job, named after it, on the node the plan gave it.
    steps = site.slurm.run("squeue", "-h", "-s", "-j", job, "-o", "%j %N").stdout.split("\n")
    placed = dict(line.split() for line in steps if line.strip() and not line.startswith("batch"))
    assert {k: v for k, v in placed.items() if not k.startswith("ucmctl-")} == {
        "prefill-0": "h1", "prefill-1": "h1", "decode-0": "h2", "decode-1": "h2", "proxy": "h1"}  # fmt: skip
    # ... and runs in its node's network namespace (its servers answer on the node's address).
    assert {h for h, _ in site.hosts.processes_of("s-2p2d")} == {"h1", "h2"}
    proxy = f"http://{site.hosts.host('h1').address}:8000"
    prompt = list(range(1, 161))
    assert completion(proxy, prompt)["usage"]["completion_tokens"] == 4
    for _ in range(3):
        completion(proxy, [*prompt, 7])
    decoders = [f"http://{site.hosts.host('h2').address}:{p}" for p in (8200, 8201)]
    assert sum(external_hits(d) for d in decoders) > 0  # KV went through the shared store
    status = cli("status", "s-2p2d")
    assert status.returncode == 0, status.stderr
    assert len(re.findall(r"\bhealthy\b", status.stdout)) == 5, status.stdout
    assert f"Slurm job {job} (ucmctl-s-2p2d): running" in status.stdout
    logs = cli("logs", "s-2p2d", "decode-1", "-n", "5")
    assert logs.returncode == 0 and "decode-1@h2 | " in logs.stdout
    # scale: a third decode is one more step of the same job, proven and routed; then taken out
    grown = cli("scale", "s-2p2d", "--decode", "3")
    assert grown.returncode == 0, grown.stderr
    assert "decode-2: KV probe: " in " ".join(grown.stderr.split()), grown.stderr
    steps = site.slurm.run("squeue", "-h", "-s", "-j", job, "-o", "%j %N").stdout.split("\n")
    assert "decode-2 h2" in [line.strip() for line in steps], steps
    assert routed(proxy) == [f"{decoders[0][:-5]}:{port}" for port in (8200, 8201, 8202)]
    assert completion(proxy, [*prompt, 9])["usage"]["completion_tokens"] == 4
    status = cli("status", "s-2p2d")
    assert len(re.findall(r"\bhealthy\b", status.stdout)) == 6, status.stdout
    shrunk = cli("scale", "s-2p2d", "--decode", "2")
    assert shrunk.returncode == 0, shrunk.stderr
    steps = site.slurm.run("squeue", "-h", "-s", "-j", job, "-o", "%j %N").stdout
    assert "decode-2" not in steps and "decode-1 h2" in steps, steps
    assert routed(proxy) == decoders
    # a job step killed during a bench: the watch sees it through Slurm and says so within 10 s
    save = tmp_path / "fault.json"
    bench = cli("bench", "--prefix-ratio", "0", "--input-len", "64", "--output-len", "30",
                "--num-prompts", "40", "--request-rate", "4", "-q", "--fault", "kill:decode-1@4s",
                "--save", str(save), timeout=300)  # fmt: skip
    f = json.loads(save.read_text())["cells"][0]["measure"]["fault"]
    assert f["injected"] and f["was_running"], (f, bench.stderr)
    assert re.search(r"^LOST decode-1 on h2: ", bench.stderr, re.MULTILINE), bench.stderr
    assert f["detected_after_s"] is not None and f["detected_after_s"] <= 10, f
    # the answers it was streaming went on on decode-0: none failed
    assert f["failed"] == 0 and f["migrated"] == f["cut_mid_stream"] and f["not_migrated"] == 0, f
    assert f["after"]["requests"] > 0 and f["after"]["failed"] == 0, f  # decode-0 served them
    # brought back as the user would: a step of the same job again, routed, serving
    back = cli("restart", "s-2p2d", "decode-1")
    assert back.returncode == 0 and back.stdout.strip() == "1 process restarted", back.stdout + back.stderr
    steps = site.slurm.run("squeue", "-h", "-s", "-j", job, "-o", "%j %N").stdout.split("\n")
    assert "decode-1 h2" in [line.strip() for line in steps], steps
    assert completion(decoders[1], [*prompt, 11])["usage"]["completion_tokens"] == 4
    status = cli("status", "s-2p2d")
    assert len(re.findall(r"\bhealthy\b", status.stdout)) == 5, status.stdout
    down = cli("down", "s-2p2d")
    assert down.returncode == 0, down.stderr
    assert "5 processes stopped" in down.stdout, down.stdout
    assert left(site, "s-2p2d") == ([], [])
    assert site.slurm.job_processes() == []


def test_xpyd_and_a_second_up_of_the_same_deployment(tmp_path: Path, site: Site, cli: Cli) -> None:
    text = centralized(site, "s-xpyd", prefill="h1, h2", decode="h2")
    topo = write(tmp_path, text)
    up = cli("up", str(topo))
    assert up.returncode == 0, up.stderr
    proxy = f"http://{site.hosts.host('h1').address}:8000"
    for i in range(6):
        assert completion(proxy, [i + 1] * 40)["usage"]["completion_tokens"] == 4
    jobs = queued(site)
    again = cli("up", str(topo))
    assert again.returncode == 2 and "already up" in again.stderr
    assert queued(site) == jobs  # nothing submitted
    # The record lost: `up` still finds the job by its name before submitting another.
    (tmp_path / "home" / "deployments" / "s-xpyd.json").unlink()
    third = cli("up", str(topo))
    assert third.returncode == 3 and "already runs job" in third.stderr, third.stderr
    assert queued(site) == jobs
    down = cli("down", str(topo))  # by the topology: the job is found by its name
    assert down.returncode == 0, down.stderr
    assert "4 processes stopped" in down.stdout
    assert left(site, "s-xpyd") == ([], [])


def test_kill_9_of_up_mid_start_then_down_topology_leaves_nothing(
    tmp_path: Path, site: Site, cli: Cli
) -> None:
    # The decode servers take a while to start (a long fake load), so `up` is killed mid-start.
    text = centralized(site, "s-kill").replace("decode: {nodes: [h2], servers_per_node: 1, port: 8200, "
                                               "flags: {block-size: 16}}",
                                               "decode: {nodes: [h2], port: 8200, flags: {block-size: 16, "
                                               "load-seconds: 60}}")  # fmt: skip
    topo = write(tmp_path, text)
    up = cli.popen("up", str(topo))
    assert wait_for(lambda: len(site.hosts.processes_of("s-kill")) >= 2, 60), "prefill never started"
    os.kill(up.pid, signal.SIGKILL)
    up.wait()
    assert queued(site)  # the allocation outlived its `up`
    down = cli("down", str(topo))
    assert down.returncode == 0, down.stderr
    assert left(site, "s-kill") == ([], [])
    assert site.slurm.job_processes() == []


def test_a_lost_node_is_reported_by_status_and_down_still_cleans_up(
    tmp_path: Path, site: Site, cli: Cli
) -> None:
    topo = write(tmp_path, centralized(site, "s-lost"))
    assert cli("up", str(topo)).returncode == 0
    site.slurm.stop_slurmd("h2")
    try:
        status = cli("status", "s-lost")
        assert status.returncode == 0, status.stderr
        rows = {line.split()[0]: line for line in status.stdout.splitlines() if line.strip()[:1].isalpha()}
        assert "unreachable" in rows["decode-0"], status.stdout
        assert "healthy" in rows["prefill-0"], status.stdout
        down = cli("down", "s-lost", "--grace", "2")
        assert down.returncode == 1 and "could not stop decode-0 (h2)" in down.stderr, down.stderr
        assert queued(site)  # kept, and the record with it: a later `down` finds them
    finally:
        site.slurm.start_slurmd("h2")
    down = cli("down", "s-lost")
    assert down.returncode == 0, down.stderr
    assert left(site, "s-lost") == ([], [])


def test_bad_slurm_input_submits_nothing(tmp_path: Path, site: Site, cli: Cli) -> None:
    def one_line(done: subprocess.CompletedProcess[str], code: int, text: str) -> None:
        assert done.returncode == code, done.stderr
        errors = [line for line in done.stderr.splitlines() if line.startswith("error")]
        assert len(errors) == 1 and text in errors[0], done.stderr
        assert queued(site) == []

    no_partition = centralized(site, "s-bad").replace("partition: debug", "partition: nosuch")
    one_line(cli("up", str(write(tmp_path, no_partition))), 3, "partition 'nosuch' does not exist")
    unknown = centralized(site, "s-bad").replace("  h2: {", "  h9: {").replace("[h2]", "[h9]")
    one_line(cli("up", str(write(tmp_path, unknown))), 3, "node h9: Slurm knows no node of that name")
    bad_time = centralized(site, "s-bad").replace('time_limit: "30:00"', "time_limit: 1h")
    done = cli("up", str(write(tmp_path, bad_time)))
    assert done.returncode == 2 and "time_limit" in done.stderr and "1h" in done.stderr, done.stderr
    assert queued(site) == []
    # /bin has sbatch
    no_slurm = Cli(tmp_path / "home", env={**cli.env, "PATH": os.path.dirname(sys.executable)})
    one_line(no_slurm("up", str(write(tmp_path, centralized(site, "s-bad")))), 3, "`sbatch` is not on")


def test_an_allocation_held_too_long_is_cancelled_with_slurms_reason(
    tmp_path: Path, site: Site, cli: Cli
) -> None:
    blocker = site.slurm.run("sbatch", "--parsable", "--exclusive", "-w", "h2", "-o", "/dev/null",
                             "--wrap", "exec sleep 300").stdout.strip()  # fmt: skip
    try:
        assert wait_for(lambda: site.slurm.run("squeue", "-h", "-j", blocker, "-o", "%T").stdout.strip()
                        == "RUNNING")  # fmt: skip
        topo = write(tmp_path, centralized(site, "s-held"))  # waits 60 s, unless told otherwise
        done = cli("up", str(topo), "--wait-allocation", "2")
        assert done.returncode == 1, done.stderr
        errors = [line for line in done.stderr.splitlines() if line.startswith("error")]
        assert len(errors) == 1 and "still pending after 2 s" in errors[0], done.stderr
        assert re.search(r"\((Resources|Priority|ReqNodeNotAvail[^)]*)\)", errors[0]), errors[0]
        assert queued(site) == [blocker]  # nothing of ours left queued
        assert not (tmp_path / "home" / "deployments" / "s-held.json").exists()
    finally:
        site.slurm.run("scancel", blocker)
        wait_for(lambda: queued(site) == [])


def test_slurm_chooses_the_nodes_and_the_plan_is_bound_to_them(tmp_path: Path, site: Site, cli: Cli) -> None:
    text = f"""
name: s-chosen
mode: centralized
engine: sim
model: {{path: sim-model}}
cluster: {{kind: slurm, partition: debug, choose_nodes: true}}
nodes:
  prefill-node: {{platform: cpu, python: {sys.executable}, workdir: {site.hosts.shared / "work"}}}
  decode-node: {{platform: cpu, python: {sys.executable}, workdir: {site.hosts.shared / "work"}}}
storage: {{storage_backends: {site.hosts.shared / "s-chosen"}, cache_buffer_capacity_gb: 0.25}}
prefill: {{nodes: [prefill-node], port: 8100, flags: {{block-size: 16}}}}
decode: {{nodes: [decode-node], port: 8200, flags: {{block-size: 16}}}}
proxy: {{node: prefill-node, port: 8000}}
"""
    topo = write(tmp_path, text)
    up = cli("up", str(topo))
    assert up.returncode == 0, up.stderr
    record = json.loads((tmp_path / "home" / "deployments" / "s-chosen.json").read_text())
    # names in order: decode-node < prefill-node, h1 < h2
    assert record["allocation"]["nodes"] == {"decode-node": "h1", "prefill-node": "h2"}
    nodes = record["plan"]["nodes"]
    assert nodes["prefill-node"]["slurm_node"] == "h2"
    assert nodes["prefill-node"]["host"] == site.hosts.host("h2").address  # Slurm's NodeAddr
    proxy = next(p["url"] for p in record["plan"]["processes"] if p["role"] == "proxy")
    assert proxy == f"http://{site.hosts.host('h2').address}:8000"
    assert completion(proxy, list(range(1, 100)))["usage"]["completion_tokens"] == 4
    assert {h for h, _ in site.hosts.processes_of("s-chosen")} == {"h1", "h2"}
    status = cli("status")
    assert status.returncode == 0 and len(re.findall(r"\bhealthy\b", status.stdout)) == 3, status.stdout
    # The record lost: `down TOPOLOGY` finds the job by its name and binds the nodes again.
    (tmp_path / "home" / "deployments" / "s-chosen.json").unlink()
    down = cli("down", str(topo))
    assert down.returncode == 0, down.stderr
    assert "3 processes stopped" in down.stdout
    assert left(site, "s-chosen") == ([], [])


def test_nodes_failing_preflight_give_the_allocation_back(tmp_path: Path, site: Site, cli: Cli) -> None:
    text = centralized(site, "s-pre").replace(f"python: {sys.executable}", "python: /nonexistent/python3", 1)
    done = cli("up", str(write(tmp_path, text)))
    assert done.returncode == 3, done.stderr
    assert "node h1" in done.stderr and "python" in done.stderr.lower(), done.stderr
    assert queued(site) == []  # submitted, then cancelled: nothing left queued
    assert not (tmp_path / "home" / "deployments" / "s-pre.json").exists()


def test_a_job_slurm_refuses_is_one_line_with_slurms_reason(tmp_path: Path, site: Site, cli: Cli) -> None:
    # This cluster has no GRES: an allocation asking for GPUs is refused by sbatch itself.
    text = centralized(site, "s-refused", cluster=", gres: gpu").replace("platform: cpu", "platform: cuda")
    done = cli("up", str(write(tmp_path, text)))
    assert done.returncode == 1, done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("error")]
    assert len(errors) == 1 and "sbatch refused the allocation" in errors[0], done.stderr
    assert "gres" in errors[0].lower(), errors[0]  # Slurm's own words
    assert queued(site) == []
    assert not (tmp_path / "home" / "deployments" / "s-refused.json").exists()
