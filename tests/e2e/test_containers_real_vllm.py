"""The real vLLM (CPU, tiny model) over SSH on network-namespace hosts, first bare (1P2D on three
hosts, one decode killed mid-run), then 1P1D with every process in a podman container of an
image that stands in for a user's vLLM image (Debian and the venv's vLLM, without ucmctl:
tests/support/containers.py): `ucmctl image build` derives the image on both hosts, `up` passes
the KV probe, the greedy answer through the proxy equals the bare deployment's token for token,
`status` reads a kill -9 of decode's container as `exited (137)`, `down` leaves no container and
no process on either host."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.support.cli import Cli
from tests.support.containers import build_base_image, cgroup_parent, remove_cgroup
from tests.support.netns import Cluster
from tests.support.openai_checks import counter, greedy_with_logprobs
from tests.support.topology import vllm_role
from ucmctl.deploy.health import why_not

pytestmark = [pytest.mark.slow, pytest.mark.root]
BLOCK = 128
BASE = "ucmctl-test-vllm:1"


HOSTS = {"count": 3, "containers": True}  # the `hosts` fixture's (tests/support/fixtures.py)


def topology(c: Cluster, model: Path, name: str, container: str = "", decode_nodes: str = "h2",
             decode: str = "") -> str:  # fmt: skip
    line = "  {n}: {{host: {addr}, key: {key}, platform: cpu, devices: 0, python: {py}{container}}}"
    nodes = "\n".join(
        line.format(n=n, addr=c.host(n).address, key=c.key, py=sys.executable, container=container)
        for n in sorted({"h1", *decode_nodes.split(", ")})
    )
    return f"""
name: {name}
mode: centralized
model: {{path: {model}, served_name: m, dtype: bfloat16, hash_seed: 0}}
nodes:
{nodes}
storage: {{storage_backends: {c.shared / name}, cache_buffer_capacity_gb: 0.25}}
prefill: {vllm_role("h1", 8100)}
decode: {vllm_role(decode_nodes, 8200, decode)}
proxy: {{node: h1, port: 8000}}
"""


def podman_on(c: Cluster, host: str, *args: str) -> str:
    """podman as the host's own (its SSH session's mount namespace: its own store)."""
    done = subprocess.run(["ssh", "-F", str(c.ssh_config), host, "podman", *args], capture_output=True,
                          text=True, timeout=120, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_1p1d_in_containers_answers_as_the_bare_one(hosts: Cluster, tmp_path: Path) -> None:
    from ucmctl.tinymodel import make_model

    model = make_model(hosts.shared / "tiny", size="tiny", seed=0)
    build_base_image(hosts.image_env, BASE, engine=True)
    group = f"ucmctl-e2e-{os.getpid()}"
    ucmctl = Cli(tmp_path / "home", hosts.ssh_config, timeout=900)

    prompt = [(i * 37) % 3000 + 20 for i in range(3 * BLOCK + 40)]  # 3 full blocks + 40 tokens
    proxy = f"http://{hosts.host('h1').address}:8000"
    decode = f"http://{hosts.host('h2').address}:8200"

    # bare: 1P2D, prefill on h1, decode-0 on h2, decode-1 on h3, decode restarted on failure
    bare = tmp_path / "bare.yaml"
    bare.write_text(topology(hosts, model, "e2e-bare", decode_nodes="h2, h3",
                             decode=", restart: {policy: on-failure, backoff_s: 1}"))  # fmt: skip
    up = ucmctl("up", str(bare))
    assert up.returncode == 0, up.stderr[-3000:]
    try:
        reference = greedy_with_logprobs(proxy, prompt)
        decode_lost_and_back(ucmctl, hosts, tmp_path / "fault.json", prompt, reference[0])
    finally:
        assert ucmctl("down", "e2e-bare").returncode == 0

    container = (f", container: {{runtime: podman, image: localhost/{BASE}, "
                 f"options: [--cgroup-parent={cgroup_parent(group)}]}}")  # fmt: skip
    pod = tmp_path / "pod.yaml"
    pod.write_text(topology(hosts, model, "e2e-pod", container))
    try:
        built = ucmctl("image", "build", str(pod))
        assert built.returncode == 0, built.stderr[-3000:]
        assert re.findall(r"^(h[12]): localhost/ucmctl/localhost/ucmctl-test-vllm:1 built in", built.stdout,
                          re.MULTILINE) == ["h1", "h2"], built.stdout  # fmt: skip

        up = ucmctl("up", str(pod))
        assert up.returncode == 0, up.stderr[-3000:]
        assert "KV probe: centralized: decode's external prefix hits grew by 1024" in up.stderr
        for host, names in (("h1", ["ucmctl-e2e-pod-prefill-0", "ucmctl-e2e-pod-proxy"]),
                            ("h2", ["ucmctl-e2e-pod-decode-0"])):  # fmt: skip
            assert sorted(podman_on(hosts, host, "ps", "--format", "{{.Names}}").split()) == names

        before = counter(decode, "vllm:external_prefix_cache_hits_total")
        answer = greedy_with_logprobs(proxy, prompt)
        assert counter(decode, "vllm:external_prefix_cache_hits_total") - before == 3 * BLOCK
        assert answer[0] == reference[0]  # the same greedy tokens as the bare deployment ...
        assert answer[1] == reference[1]  # ... and the same top logprobs

        pid = int(podman_on(hosts, "h2", "inspect", "--format", "{{.State.Pid}}", "ucmctl-e2e-pod-decode-0"))
        subprocess.run(["ssh", "-F", str(hosts.ssh_config), "h2", "kill", "-9", str(pid)], check=True,
                       timeout=60)  # fmt: skip
        deadline = time.monotonic() + 30
        status = ""
        while time.monotonic() < deadline and "exited (137)" not in status:
            status = ucmctl("status", "e2e-pod").stdout
            time.sleep(0.5)
        decode_line = next(line for line in status.splitlines() if "decode-0" in line)
        assert "exited (137)" in decode_line, status
    finally:
        down = ucmctl("down", "e2e-pod")
        remove_cgroup(group)
    assert down.returncode == 0, down.stderr
    for host in ("h1", "h2"):
        assert podman_on(hosts, host, "ps", "-a", "--format", "{{.Names}}").split() == []
    assert hosts.processes_of("e2e-pod") == []


def decode_lost_and_back(
    ucmctl: Callable[..., subprocess.CompletedProcess[str]], hosts: Cluster, save: Path, prompt: list[int],
    tokens: list[int],
) -> None:  # fmt: skip
    """`bench --fault kill:decode-1@10s` on the bare 1P2D (SIGKILL to decode-1 on h3 over SSH):
    no request fails (the answers cut mid-stream go on on decode-0, from the store), decode-0
    serves every request sent after the kill, the loss is reported within 10 s; decode-1's
    supervisor starts it again, and once back its first answer comes from the store, token for token."""
    decode0 = f"http://{hosts.host('h2').address}:8200"
    served = counter(decode0, "vllm:request_success_total")
    run = ucmctl("bench", "--prefix-ratio", "0", "--input-len", "256", "--output-len", "32",
                 "--num-prompts", "30", "--request-rate", "1", "-q", "--fault", "kill:decode-1@10s",
                 "--save", str(save))  # fmt: skip
    assert save.exists(), run.stderr[-3000:]
    (cell,) = json.loads(save.read_text())["cells"]
    f = cell["measure"]["fault"]

    def said() -> str:  # only where an assertion fails: the proxy's log is read over SSH
        return f"{json.dumps(f)}\n{run.stdout}\n{ucmctl('logs', 'e2e-bare', 'proxy', '-n', '200').stdout}"

    assert f["injected"] and f["was_running"], said()
    assert f["failed"] == cell["measure"]["failed"] == 0, said()
    assert f["migrated"] == f["cut_mid_stream"] <= f["streaming_on_it"] and f["not_migrated"] == 0, said()
    assert run.returncode == 0, run.stderr[-3000:]
    # decode-0 kept serving: every request sent after the kill was answered, and it served them
    # (seed 0 at 1/s sends 4 requests in the 10 s after)
    assert f["after"]["requests"] >= 2 and f["after"]["failed"] == 0, json.dumps(f)
    assert counter(decode0, "vllm:request_success_total") - served >= f["after"]["requests"]
    assert f["detected_after_s"] is not None and f["detected_after_s"] <= 10, f
    decode1 = f"http://{hosts.host('h3').address}:8200"
    prefill = f"http://{hosts.host('h1').address}:8100"
    deadline = time.monotonic() + 240
    status = ""
    while time.monotonic() < deadline:
        status = ucmctl("status", "e2e-bare").stdout
        row = next(line for line in status.splitlines() if line.startswith("decode-1 "))
        if "restarted 1x" in row and why_not(decode1 + "/health") is None:
            break
        time.sleep(2)
    assert "running, restarted 1x" in row, status
    # a prompt prefill stores, then sent to the restarted decode-1 itself: loaded from the store
    fresh = [(i * 41) % 3000 + 20 for i in range(3 * BLOCK + 40)]
    stored = greedy_with_logprobs(prefill, fresh)
    before = counter(decode1, "vllm:external_prefix_cache_hits_total")
    assert greedy_with_logprobs(decode1, fresh)[0] == stored[0]
    assert counter(decode1, "vllm:external_prefix_cache_hits_total") - before == 3 * BLOCK
    assert greedy_with_logprobs(decode1, prompt)[0] == tokens
