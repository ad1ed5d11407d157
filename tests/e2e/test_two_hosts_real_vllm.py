"""1P1D with the real vLLM (tiny model) over SSH on two network-namespace hosts sharing one
storage folder, a GlusterFS volume served from a third host (each of the two mounts it with its
own FUSE client): requests through the proxy (routing by KV: it reads both servers' KV-cache
events), decode loads the prefix that prefill stored, and its greedy tokens equal those of an
instance holding the same prefix in its own cache. Then the
storage fails during `ucmctl bench` three ways (the brick killed, the storage host's link cut
30 s, the volume stopped and started): no request fails, the report names the errors, no store
wait outlasts its bound by a second, and KV crosses the store again once it is back."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.support import gluster
from tests.support.cli import Cli
from tests.support.netns import Cluster
from tests.support.openai_checks import counter, greedy_with_logprobs
from tests.support.processes import in_the_kernel, wait_for
from tests.support.topology import vllm_role

pytestmark = [pytest.mark.slow, pytest.mark.root]
BLOCK = 128
BOUND_S = 2.0  # the deployment's load and dump bound


HOSTS = 3  # the `hosts` fixture's (tests/support/fixtures.py)


@pytest.fixture(scope="module")
def volume(hosts: Cluster) -> Iterator[gluster.Volume]:
    if reason := gluster.available():
        pytest.skip(reason)
    # the brick a tmpfs: the faults are the network filesystem's (tests/support/storage_rig.py)
    with gluster.gluster_volume(hosts, "e2e", server="h3", clients=["h1", "h2"], brick_in_memory="1g") as vol:
        # A client gives up on a server that does not answer after this long (default 42 s).
        vol.gluster("volume", "set", vol.name, "network.ping-timeout", "5")
        yield vol


def topology(c: Cluster, model: Path, store: Path) -> str:
    line = "  {n}: {{host: {addr}, key: {key}, platform: cpu, devices: 0, python: {py}}}"
    nodes = "\n".join(
        line.format(n=n, addr=c.host(n).address, key=c.key, py=sys.executable) for n in ("h1", "h2")
    )
    return f"""
name: e2e-two-hosts
mode: centralized
model: {{path: {model}, served_name: m, dtype: bfloat16, hash_seed: 0}}
nodes:
{nodes}
storage: {{storage_backends: {store}, cache_buffer_capacity_gb: 0.25, load_timeout_s: {BOUND_S},
          dump_timeout_s: {BOUND_S}}}
prefill: {vllm_role("h1", 8100)}
decode: {vllm_role("h2", 8200)}
proxy: {{node: h1, port: 8000, routing: kv}}
"""


def test_1p1d_over_ssh_decode_hits_what_prefill_stored(
    hosts: Cluster, volume: gluster.Volume, tmp_path: Path
) -> None:
    from ucmctl.tinymodel import make_model

    model = make_model(hosts.shared / "tiny", size="tiny", seed=0)
    topo = tmp_path / "topology.yaml"
    topo.write_text(topology(hosts, model, volume.mount / "store"))
    ucmctl = Cli(tmp_path / "home", hosts.ssh_config, timeout=900)
    env = ucmctl.env

    up = ucmctl("up", str(topo))
    assert up.returncode == 0, up.stderr[-3000:]
    # the KV probe (1100 tokens: 8 whole blocks) proved the path before `up` said so
    assert "KV probe: centralized: decode's external prefix hits grew by 1024" in up.stderr
    assert f"storage {volume.mount / 'store'}: fuse.glusterfs on h1, h2" in up.stderr
    try:
        prefill = f"http://{hosts.host('h1').address}:8100"
        decode = f"http://{hosts.host('h2').address}:8200"
        before = counter(decode, "vllm:external_prefix_cache_hits_total")
        prompt = [(i * 37) % 3000 + 20 for i in range(3 * BLOCK + 40)]  # 3 full blocks + 40 tokens
        via_proxy = greedy_with_logprobs(f"http://{hosts.host('h1').address}:8000", prompt)
        external = counter(decode, "vllm:external_prefix_cache_hits_total") - before
        assert external == 3 * BLOCK  # decode loaded every full block prefill stored
        logs = ucmctl("logs", "e2e-two-hosts", "decode-0", "-n", "400").stdout
        assert "hit external: 3" in logs
        # Prefill holds the same prefix in its own cache (it computed it): a local hit there.
        local = greedy_with_logprobs(prefill, prompt)
        # the proxy reads both servers' own KV-cache events (vLLM's publisher, as the plan set it)
        feeds = read_feeds(f"http://{hosts.host('h1').address}:8000")
        assert {f["url"] for f in feeds} == {decode, prefill}, feeds
        assert all(f["events"] > 0 for f in feeds), feeds
        assert all(f["bad"] == f["gaps"] == f["unknown_parent"] == 0 for f in feeds), feeds
        assert counter(prefill, "vllm:prefix_cache_hits_total") >= 3 * BLOCK
        assert via_proxy[0] == local[0]  # the same greedy tokens ...
        assert via_proxy[1] == local[1]  # ... and the same top logprobs: the same KV bytes
        # n > 1 through both legs, as the openai client sends it (sampled: vLLM refuses n > 1
        # greedy): decode loads the prompt's blocks prefill stored and answers both choices
        sampled = [(i * 41) % 3000 + 20 for i in range(3 * BLOCK + 40)]
        before = counter(decode, "vllm:external_prefix_cache_hits_total")
        body = {"model": "m", "prompt": sampled, "max_tokens": 8, "n": 2, "temperature": 1.0, "seed": 1,
                "ignore_eos": True}  # fmt: skip
        url = f"http://{hosts.host('h1').address}:8000/v1/completions"
        headers = {"Content-Type": "application/json"}
        req = urllib.request.Request(url, data=json.dumps(body).encode(), headers=headers)
        with urllib.request.urlopen(req, timeout=300) as r:
            answer = json.loads(r.read())
        assert sorted(c["index"] for c in answer["choices"]) == [0, 1], answer
        assert answer["usage"]["completion_tokens"] == 16, answer
        assert counter(decode, "vllm:external_prefix_cache_hits_total") - before >= 3 * BLOCK
        # as users type it: the one deployment, its model's vocabulary, an input that fits
        bench = ucmctl("bench", "--prefix-ratio", "0.8", "--num-prompts", "8")
        assert bench.returncode == 0, bench.stderr[-3000:]
        chosen = re.search(r"input length (\d+) tokens", bench.stderr)
        assert chosen is not None and int(chosen[1]) <= 2048, bench.stderr
        rows = [r.split() for r in bench.stdout.splitlines() if r.startswith(f"{chosen[1]} ")]
        assert [(r[2], r[3]) for r in rows if len(r) == 9] == [("8", "0"), ("8", "0")], bench.stdout
        proxy = f"http://{hosts.host('h1').address}:8000"

        def kill_brick() -> None:
            for pid in volume.brick_pids():
                os.kill(pid, signal.SIGKILL)
            time.sleep(4)
            volume.gluster("volume", "start", volume.name, "force")

        def stop_volume() -> None:
            volume.gluster("volume", "stop", volume.name, timeout=60)
            time.sleep(4)
            volume.gluster("volume", "start", volume.name)

        faults: list[tuple[str, Callable[[], None], int]] = [
            ("brick", kill_brick, 12),
            ("cut", lambda: volume.cut_server_link(30), 40),  # the run spans the cut
            ("stop", stop_volume, 16),
        ]
        for seed, (name, fault, prompts) in enumerate(faults, start=5):
            fault_during_a_run(fault, env, prefill, decode, tmp_path / f"{name}.json", prompts, seed)
            volume.wait_serving()
            # The store is back: a new prompt's KV crosses it again, the same greedy tokens as
            # prefill's own (the clients reconnect by themselves; the first tries may still miss).
            fresh = [(i * (53 + seed)) % 3000 + 20 for i in range(3 * BLOCK + 40)]
            crossed = kv_crosses_the_store(proxy, decode, fresh)
            assert crossed is not None, f"after the {name} fault: decode loaded no whole prompt in 60 s"
            tried, tokens = crossed
            assert tokens == greedy_with_logprobs(prefill, tried)[0], name
    finally:
        down = ucmctl("down")
        stuck = in_the_kernel() if down.returncode else ""
    assert down.returncode == 0, f"{down.stderr}\n{stuck}"
    assert "3 processes stopped" in down.stdout
    assert hosts.processes_of("e2e-two-hosts") == []
    blocks = [f for f in (volume.brick / "store").rglob("*") if f.is_file()]
    assert len(blocks) >= 8, blocks  # the blocks went to the server's brick, over the network


def read_feeds(proxy: str) -> list[dict]:
    """The proxy's KV-event feeds once each has read an event (vLLM publishes a step's events
    right after it)."""

    def feeds() -> list[dict]:
        with urllib.request.urlopen(proxy + "/routing", timeout=10) as r:
            return json.loads(r.read()).get("kv_events", [])

    wait_for(lambda: all(f["events"] > 0 for f in feeds() or [{"events": 0}]), timeout=30)
    return feeds()


def kv_crosses_the_store(proxy: str, decode: str, prompt: list[int]) -> tuple[list[int], list[int]] | None:
    """A prompt and its greedy tokens through the proxy once decode loaded all of its full blocks
    from the store (each try a new first token, so a fresh prefix); None if no try did so
    within a minute."""
    deadline = time.monotonic() + 60
    for attempt in range(60):
        tried = [prompt[0] + attempt, *prompt[1:]]
        before = counter(decode, "vllm:external_prefix_cache_hits_total")
        tokens = greedy_with_logprobs(proxy, tried)[0]
        if counter(decode, "vllm:external_prefix_cache_hits_total") - before == 3 * BLOCK:
            return tried, tokens
        if time.monotonic() > deadline:
            break
        time.sleep(1)
    return None


def fault_during_a_run(fault: Callable[[], None], env: dict[str, str], prefill: str, decode: str,
                       save: Path, prompts: int, seed: int) -> None:  # fmt: skip
    """The real vLLM connector when the storage fails mid-run (`fault` runs once two requests
    are done and returns when the storage is back): no request fails, the report names the
    storage errors, no store wait outlasted its bound by more than a second, the servers serve."""
    start = counter(prefill, "vllm:request_success_total")
    cmd = [sys.executable, "-m", "ucmctl", "bench", "--prefix-ratio", "0", "--input-len", "512",
           "--output-len", "8", "--num-prompts", str(prompts), "--request-rate", "1",
           "--seed", str(seed), "--save", str(save), "-q"]  # fmt: skip
    run = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        assert wait_for(lambda: counter(prefill, "vllm:request_success_total") >= start + 2, timeout=120)
        assert run.poll() is None, "the run ended before the fault"
        fault()
        out, err = run.communicate(timeout=600)
    finally:
        if run.poll() is None:
            run.kill()
    assert run.returncode == 0 and "Traceback" not in err, err[-3000:]
    (cell,) = json.loads(save.read_text())["cells"]
    phase = cell["measure"]
    assert phase["completed"] == prompts and phase["failed"] == 0, phase["errors"]
    total = phase["hit_rate"]["total"]
    assert total["ucm_lookup_errors"] + total["ucm_load_errors"] + total["ucm_save_errors"] > 0, total
    assert total["ucm_load_errors_corrupt"] == 0  # no block delivered with wrong bytes
    assert phase["lost"] == []  # the bench's watch: both servers stayed up and healthy
    # every lookup, load and persist wait ended within its bound + 1 s (the connector counts any
    # that did not, on both servers)
    over = {k: v for k, v in total.items() if k.endswith("_waits_over_bound") and v}
    assert len([k for k in total if k.endswith("_waits_over_bound")]) == 3 and not over, total
    said = [line for line in out.splitlines() if "UCM store:" in line]
    assert len(said) == 1 and said[0].startswith("measure"), out
