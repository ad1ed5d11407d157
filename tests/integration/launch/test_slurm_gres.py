"""Accelerators as Slurm GRES (`cluster.gres`), on a real Slurm whose nodes each count two
"GPUs" (a stand-in: two virtual consoles as Slurm's device files, since there are no GPUs here):
the allocation asks for them, every step is given them, and each process keeps the devices
the plan chose for it, counted within the job's."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tests.support.cli import Cli
from tests.support.http import completion
from tests.support.processes import environ
from tests.support.slurm import Site
from tests.support.slurm_topology import queued
from tests.support.topology import write

pytestmark = [pytest.mark.slow, pytest.mark.root]


SLURM_SITE = {"gpus": 2}  # the site's `site` fixture (tests/support/fixtures.py)


def test_the_allocation_and_every_step_get_the_gres_and_processes_keep_their_devices(
    tmp_path: Path, site: Site, cli: Cli
) -> None:
    node = "  {n}: {{host: {a}, platform: cuda, devices: 2, python: {py}, workdir: {w}}}"
    work = site.hosts.shared / "work"
    nodes = "\n".join(node.format(n=n, a=site.hosts.host(n).address, py=sys.executable, w=work)
                      for n in ("h1", "h2"))  # fmt: skip
    topo = write(
        tmp_path,
        f"""
name: s-gres
mode: centralized
engine: sim
model: {{path: sim-model}}
cluster: {{kind: slurm, partition: debug, gres: gpu}}
nodes:
{nodes}
storage: {{storage_backends: {site.hosts.shared / "s-gres"}, cache_buffer_capacity_gb: 0.25}}
prefill: {{nodes: [h1], servers_per_node: 2, port: 8100, flags: {{block-size: 16}}}}
decode: {{nodes: [h2], port: 8200, flags: {{block-size: 16}}}}
proxy: {{node: h1, port: 8000}}
""",
    )
    # preflight would count the nodes' GPUs with nvidia-smi: there is none here
    up = cli("up", str(topo), "--skip-preflight")
    assert up.returncode == 0, up.stderr
    try:
        record = json.loads((tmp_path / "home" / "deployments" / "s-gres.json").read_text())
        job = record["allocation"]["job_id"]
        asked = site.slurm.run("squeue", "-h", "-j", job, "-o", "%b").stdout.strip()
        assert asked == "gres:gpu:2", asked  # per node: the plan's busiest node uses 2
        seen = {}
        for host, pid in site.hosts.processes_of("s-gres"):
            env = environ(pid)
            step = env.get("SLURM_JOB_NAME", "")  # in a step: the step's name
            if "UCMCTL_PROCESS" in env and step.startswith(("prefill", "decode")):
                seen[step] = (host, env.get("SLURM_STEP_GPUS"), env["CUDA_VISIBLE_DEVICES"])
        # Slurm gave each step both of its node's GPUs; the plan's choice within them stands.
        assert seen == {"prefill-0": ("h1", "0,1", "0"), "prefill-1": ("h1", "0,1", "1"),
                        "decode-0": ("h2", "0,1", "0")}, seen  # fmt: skip
        proxy = f"http://{site.hosts.host('h1').address}:8000"
        assert completion(proxy, list(range(1, 60)))["usage"]["completion_tokens"] == 4
    finally:
        down = cli("down", "s-gres")
    assert down.returncode == 0, down.stderr
    assert site.hosts.processes_of("s-gres") == [] and queued(site) == []
