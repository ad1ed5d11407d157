"""1P1D with the real vLLM (tiny model) through a real Slurm: one allocation over two
network-namespace nodes, each server a job step. Decode loads the prefix prefill stored, its
greedy tokens equal prefill's own, and `down` leaves no step, no job and no process."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from tests.support.cli import Cli
from tests.support.openai_checks import counter, greedy_with_logprobs
from tests.support.slurm import Site
from tests.support.topology import vllm_role

pytestmark = [pytest.mark.slow, pytest.mark.root]
BLOCK = 128


def topology(hosts: Any, model: Path) -> str:
    line = "  {n}: {{host: {addr}, platform: cpu, devices: 0, python: {py}, workdir: {work}}}"
    work = hosts.shared / "work"
    nodes = "\n".join(line.format(n=n, addr=hosts.host(n).address, py=sys.executable, work=work)
                      for n in ("h1", "h2"))  # fmt: skip
    return f"""
name: e2e-slurm
mode: centralized
model: {{path: {model}, served_name: m, dtype: bfloat16, hash_seed: 0}}
cluster: {{kind: slurm, partition: debug, time_limit: "1:00:00"}}
nodes:
{nodes}
storage: {{storage_backends: {hosts.shared / "store"}, cache_buffer_capacity_gb: 0.25}}
prefill: {vllm_role("h1", 8100)}
decode: {vllm_role("h2", 8200)}
proxy: {{node: h1, port: 8000}}
"""


def test_1p1d_real_vllm_as_slurm_job_steps(site: Site, tmp_path: Path) -> None:
    from ucmctl.tinymodel import make_model

    hosts, slurm = site.hosts, site.slurm
    model = make_model(hosts.shared / "tiny", size="tiny", seed=0)
    topo = tmp_path / "topology.yaml"
    topo.write_text(topology(hosts, model))
    ucmctl = Cli(tmp_path / "home", env=slurm.env, timeout=1200)

    up = ucmctl("up", str(topo))
    assert up.returncode == 0, up.stderr[-3000:]
    assert "KV probe: centralized: decode's external prefix hits grew by 1024" in up.stderr
    try:
        steps = slurm.run("squeue", "-h", "-s", "-o", "%j %N").stdout.split("\n")
        placed = {s.split()[0]: s.split()[1] for s in steps if s.split() and s.split()[0] in
                  ("prefill-0", "decode-0", "proxy")}  # fmt: skip
        assert placed == {"prefill-0": "h1", "decode-0": "h2", "proxy": "h1"}
        prefill = f"http://{hosts.host('h1').address}:8100"
        decode = f"http://{hosts.host('h2').address}:8200"
        before = counter(decode, "vllm:external_prefix_cache_hits_total")
        prompt = [(i * 37) % 3000 + 20 for i in range(3 * BLOCK + 40)]  # 3 full blocks + 40 tokens
        via_proxy = greedy_with_logprobs(f"http://{hosts.host('h1').address}:8000", prompt)
        assert counter(decode, "vllm:external_prefix_cache_hits_total") - before == 3 * BLOCK
        local = greedy_with_logprobs(prefill, prompt)  # prefill holds the prefix in its own cache
        assert via_proxy == local  # the same greedy tokens and top logprobs: the same KV bytes
        logs = ucmctl("logs", "e2e-slurm", "decode-0", "-n", "400").stdout
        assert "hit external: 3" in logs
    finally:
        down = ucmctl("down")
    assert down.returncode == 0, down.stderr
    assert "3 processes stopped" in down.stdout
    assert hosts.processes_of("e2e-slurm") == []
    assert slurm.run("squeue", "-h", "-o", "%i").stdout.split() == []
    assert slurm.job_processes() == []
