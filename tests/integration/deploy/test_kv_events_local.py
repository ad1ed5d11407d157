"""`up` of a topology whose proxy routes by KV (`routing: kv`): every server publishes its
KV-cache events (the plan's --kv-events-config), the proxy reads them (its --kv-events), and
`status` says the index learns from them; with `kv_events: false`, from its routing history."""

from __future__ import annotations

import json
import re
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.cli import Cli
from tests.support.processes import free_port, wait_for

pytestmark = pytest.mark.slow


def topology(tmp: Path, name: str, proxy_port: int, events: bool = True) -> Path:
    """1P2D of the simulator on this machine, blocks of 16 tokens, the proxy routing by KV."""
    path = tmp / f"{name}.yaml"
    path.write_text(f"""
name: {name}
mode: centralized
engine: sim
model: {{path: sim-model}}
nodes:
  me: {{host: 127.0.0.1, transport: local, platform: cpu, python: {sys.executable}, workdir: {tmp / "work"}}}
storage: {{storage_backends: {tmp / "store"}, cache_buffer_capacity_gb: 0.25}}
prefill: {{nodes: [me], port: {free_port(2)}, kv_events_port: {free_port(2)}, flags: {{block-size: 16}}}}
decode: {{nodes: [me], servers_per_node: 2, port: {free_port(4)}, kv_events_port: {free_port(4)},
         flags: {{block-size: 16}}}}
proxy: {{node: me, port: {proxy_port}, routing: kv, kv_events: {"true" if events else "false"}}}
""")  # fmt: skip
    return path


@pytest.fixture
def ucmctl(tmp_path: Path) -> Iterator[Cli]:
    cli = Cli(tmp_path / "home")
    yield cli
    cli("down", timeout=120)


def routing(port: int) -> dict:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/routing", timeout=5) as r:
        return json.loads(r.read())


def complete(port: int, prompt: list[int]) -> None:
    body = json.dumps({"model": "sim-model", "prompt": prompt, "max_tokens": 2}).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", data=body,
                                 headers={"Content-Type": "application/json"})  # fmt: skip
    with urllib.request.urlopen(req, timeout=30) as r:
        assert r.status == 200


def test_kv_routing_reads_every_servers_kv_events(ucmctl: Cli, tmp_path: Path) -> None:
    port = free_port()
    up = ucmctl("up", str(topology(tmp_path, "kvev", port)), timeout=180)
    assert up.returncode == 0, up.stderr
    facts = routing(port)
    assert facts["index"] == "vLLM KV events of 3 instances, with the proxy's routing history"
    assert sorted(f["endpoint"].rsplit(":", 1)[0] for f in facts["kv_events"]) == ["tcp://127.0.0.1"] * 3
    tries = iter(range(1000))

    def every_server_heard() -> bool:  # each request stores new blocks on the prefill and a decode
        complete(port, [next(tries) + 10] * 100)
        return all(f["events"] > 0 for f in routing(port)["kv_events"])

    assert wait_for(every_server_heard, 30, every=0.2), routing(port)["kv_events"]
    assert all(f["bad"] == 0 and f["unknown_parent"] == 0 for f in routing(port)["kv_events"])
    status = ucmctl("status", "kvev").stdout
    said = " ".join(status.split())  # its lines wrap at 80 columns
    assert "index: vLLM KV events of 3 instances, with the proxy's routing history" in said, status
    assert re.search(r"\(\d+ events read, 0 batches missed, 0 malformed\)", said), status
    assert "kv_events:" in said  # the ports column names the publishers' ports


def test_kv_events_off_leaves_the_routing_history(ucmctl: Cli, tmp_path: Path) -> None:
    port = free_port()
    up = ucmctl("up", str(topology(tmp_path, "kvoff", port, events=False)), timeout=180)
    assert up.returncode == 0, up.stderr
    facts = routing(port)
    assert facts["index"].startswith("approximate") and "kv_events" not in facts
