"""Packs through the connector (`pack_blocks` in the UCM config): the scheduler side gives each
saved and loaded block its pack, holds back a pack's blocks until they are all computed (or the
prompt's prefill ends), and the worker side writes and reads them as packs of the real store.

The store is the real `ucm_store` on a temporary folder: the scheduler's lookup-only store
(Posix) and the worker's (Cache|Posix) share it, as on one node.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import ucm_store
from ucm_connector.keys import KeyMaker, Namespace
from ucm_connector.scheduler import SchedulerSide
from ucm_connector.worker import WorkerSide

from tests.support.processes import wait_for
from tests.unit.connector.test_scheduler import blocks, new_req, step

LAYERS, KV_BLOCKS, HEADS, BS, HD = 2, 32, 2, 4, 4
SHARD = HEADS * BS * 2 * HD * 2  # one layer of one block, bf16


def namespace() -> Namespace:
    return Namespace(
        model="m", dtype="bfloat16", layout="cpu/LBHNC", block_size=BS, tp_size=1, num_layers=LAYERS,
        shard_bytes=SHARD,
    )  # fmt: skip


def prompt(req_id: str, nblocks: int, tag: str = "p") -> SimpleNamespace:
    hashes = [f"{tag}{i}".encode().ljust(32, b".") for i in range(nblocks)]
    tokens = nblocks * BS + 1
    return SimpleNamespace(
        request_id=req_id, num_tokens=tokens, num_prompt_tokens=tokens, block_hashes=hashes
    )


class Node:
    """One node's scheduler and worker sides over one store folder."""

    def __init__(self, root: Path, pack_blocks: int, lookup_timeout_s: float | None = None) -> None:
        self.km = KeyMaker(namespace())
        cfg = {"store_pipeline": "Posix", "storage_backends": str(root)}
        self.lookup_store = ucm_store.Store.from_config(cfg, shard_sizes=[SHARD] * LAYERS)
        self.scheduler = SchedulerSide(
            self.lookup_store, self.km, BS, pack_blocks=pack_blocks, lookup_timeout_s=lookup_timeout_s
        )
        self.storage = torch.randn(LAYERS, KV_BLOCKS, HEADS, BS, 2 * HD).to(torch.bfloat16)
        caches = {f"model.layers.{i}.self_attn.attn": self.storage[i] for i in range(LAYERS)}
        self.stores: list[ucm_store.Store] = []

        def open_store(sizes: list[int]) -> ucm_store.Store:
            store = ucm_store.Store.from_config(
                {
                    "store_pipeline": "Cache|Posix",
                    "storage_backends": str(root),
                    "cache_buffer_capacity_gb": 0.01,
                },
                shard_sizes=sizes,
            )
            self.stores.append(store)
            return store

        self.worker = WorkerSide(open_store, self.km, wait_persisted=True)
        self.worker.register_kv_caches(caches, list(caches), expected_shard_bytes=SHARD)

    def load(self, meta) -> None:
        """A step as vLLM runs it: loads before the forward, saves after it."""
        self.worker.start_load(meta)
        for i in range(LAYERS):
            self.worker.wait_for_layer_load(f"model.layers.{i}.self_attn.attn")
        self.worker.wait_for_save(meta)

    def close(self) -> None:
        for s in [self.lookup_store, *self.stores]:
            s.close()


@pytest.fixture
def nodes(tmp_path: Path):
    made: list[Node] = []

    def make(pack_blocks: int, lookup_timeout_s: float | None = None) -> Node:
        made.append(Node(tmp_path / "kv", pack_blocks, lookup_timeout_s))
        return made[-1]

    yield make
    for n in made:
        n.close()


def packs_on_disk(root: Path) -> dict[str, int]:
    """Pack file name -> how many blocks it holds (from its size)."""
    stride = -(-SHARD * LAYERS // 4096) * 4096
    return {p.name: (p.stat().st_size - 4096) // stride for p in root.rglob("*.pack")}


def test_a_prompt_prefilled_in_chunks_is_saved_in_whole_packs_and_found_by_another_node(nodes, tmp_path):
    a = nodes(4)
    req = prompt("r1", 10)  # 10 full blocks + 1 token: packs [0..3], [4..7], [8, 9]
    ids = list(range(1, 12))
    assert a.scheduler.get_num_new_matched_tokens(req, 0) == (0, False)
    a.scheduler.update_state_after_alloc(req, blocks(ids), 0)
    keys = a.km.keys(req.block_hashes)
    # chunk 1: 6 blocks computed; only the complete pack [0..3] is saved
    m1 = a.scheduler.build_connector_meta(step(new=[new_req("r1", ids, 0)], scheduled={"r1": 6 * BS}))
    assert [(s.keys, s.packs) for s in m1.saves] == [(keys[:4], [(keys[0], i) for i in range(4)])]
    a.worker.wait_for_save(m1)
    # chunk 2: the rest of the prompt: the held-back blocks 4, 5 with 6..9, the last pack shorter
    m2 = a.scheduler.build_connector_meta(
        step(cached=[("r1", None, 6 * BS, False)], scheduled={"r1": 4 * BS + 1})
    )
    assert [s.keys for s in m2.saves] == [keys[4:10]]
    assert m2.saves[0].packs == [(keys[4], i) for i in range(4)] + [(keys[8], 0), (keys[8], 1)]
    a.worker.wait_for_save(m2)
    assert packs_on_disk(tmp_path / "kv") == {f"{keys[0].hex()}.pack": 4, f"{keys[4].hex()}.pack": 4,
                                              f"{keys[8].hex()}.pack": 2}  # fmt: skip
    assert [p for p in (tmp_path / "kv").rglob("*") if p.is_file() and len(p.name) == 32] == []
    # Another node finds all 10 blocks and loads them byte for byte into other KV blocks.
    b = nodes(4)
    again = prompt("r2", 10)
    assert b.scheduler.get_num_new_matched_tokens(again, 0) == (10 * BS, False)
    dest = list(range(20, 31))
    b.scheduler.update_state_after_alloc(again, blocks(dest), 10 * BS)
    meta = b.scheduler.build_connector_meta(step(new=[new_req("r2", dest, 10 * BS)], scheduled={"r2": 1}))
    (load,) = meta.loads
    assert load.packs == [(keys[p - p % 4], p % 4) for p in range(10)]
    b.load(meta)
    assert b.worker.take_load_errors() == set()
    assert torch.equal(b.storage[:, 20:30], a.storage[:, 1:11])
    assert b.stores[0].stats()["posix_packs_read"] == 3


def test_a_prompt_that_shares_a_system_prompt_finds_the_shared_blocks_in_the_others_pack(nodes, tmp_path):
    a = nodes(8)
    first = prompt("r1", 8, "sys")
    ids = list(range(1, 10))
    a.scheduler.get_num_new_matched_tokens(first, 0)
    a.scheduler.update_state_after_alloc(first, blocks(ids), 0)
    a.worker.wait_for_save(
        a.scheduler.build_connector_meta(step(new=[new_req("r1", ids, 0)], scheduled={"r1": 33}))
    )
    # the same 5 blocks of system prompt, then another question
    other = prompt("r2", 8, "sys")
    other.block_hashes = first.block_hashes[:5] + [f"q{i}".encode().ljust(32, b".") for i in range(3)]
    b = nodes(8)
    assert b.scheduler.get_num_new_matched_tokens(other, 0) == (5 * BS, False)
    dest = list(range(20, 29))
    b.scheduler.update_state_after_alloc(other, blocks(dest), 5 * BS)
    meta = b.scheduler.build_connector_meta(
        step(new=[new_req("r2", dest, 5 * BS)], scheduled={"r2": 3 * BS + 1})
    )
    # its own 3 blocks: a tail pack named by the first of them, beside the first prompt's pack
    # (which holds the shared 5 only); no file of one block
    keys, okeys = a.km.keys(first.block_hashes), b.km.keys(other.block_hashes)
    (load,) = meta.loads
    assert load.packs == [(keys[0], i) for i in range(5)]
    assert [(s.keys, s.packs) for s in meta.saves] == [(okeys[5:], [(okeys[5], i) for i in range(3)])]
    b.load(meta)
    assert b.worker.take_load_errors() == set()
    assert torch.equal(b.storage[:, 20:25], a.storage[:, 1:6])
    assert packs_on_disk(tmp_path / "kv") == {f"{keys[0].hex()}.pack": 8, f"{okeys[5].hex()}.pack": 3}
    assert [p for p in (tmp_path / "kv").rglob("*") if p.is_file() and len(p.name) == 32] == []
    # a third node with the second prompt finds all 8, in the two packs, byte for byte
    c = nodes(8)
    again = prompt("r3", 8)
    again.block_hashes = other.block_hashes
    assert c.scheduler.get_num_new_matched_tokens(again, 0) == (8 * BS, False)
    dest = list(range(10, 19))
    c.scheduler.update_state_after_alloc(again, blocks(dest), 8 * BS)
    meta = c.scheduler.build_connector_meta(step(new=[new_req("r3", dest, 8 * BS)], scheduled={"r3": 1}))
    c.load(meta)
    assert c.worker.take_load_errors() == set()
    assert torch.equal(c.storage[:, 10:15], a.storage[:, 1:6])
    assert torch.equal(c.storage[:, 15:18], b.storage[:, 25:28])
    assert c.stores[0].stats()["posix_packs_read"] == 2


def save_one_prompt(node: Node) -> None:
    """`node` prefills prompt r1 of 8 blocks in one step and saves it (two packs of 4)."""
    req = prompt("r1", 8)
    node.scheduler.get_num_new_matched_tokens(req, 0)
    node.scheduler.update_state_after_alloc(req, blocks(list(range(1, 10))), 0)
    node.worker.wait_for_save(
        node.scheduler.build_connector_meta(
            step(new=[new_req("r1", list(range(1, 10)), 0)], scheduled={"r1": 33})
        )
    )


def test_a_stalled_mount_while_finding_the_packs_is_one_bounded_wait_and_misses(nodes):
    """The packs' headers are read at lookup, in vLLM's scheduler loop: a header read stuck in
    the filesystem costs the lookup's bound once, the blocks are misses, and the prompt is
    saved by its ranges as without packs on disk."""
    import time

    from ucm_store import _native

    save_one_prompt(nodes(4))
    b = nodes(4, lookup_timeout_s=0.3)
    again = prompt("r2", 8)
    _native._inject_stall("posix_stat", 1, 1200)  # the first header read waits 1.2 s
    try:
        t0 = time.perf_counter()
        assert b.scheduler.get_num_new_matched_tokens(again, 0) == (0, False)
        waited = time.perf_counter() - t0
        assert 0.25 <= waited < 1.0, f"the lookup waited {waited:.2f} s, its bound 0.3 s"
        assert b.scheduler.take_lookup_errors() == {"lookup_errors": 1, "lookup_errors_timeout": 1}
        b.scheduler.update_state_after_alloc(again, blocks(list(range(10, 19))), 0)
        meta = b.scheduler.build_connector_meta(
            step(new=[new_req("r2", list(range(10, 19)), 0)], scheduled={"r2": 33})
        )
        keys = b.km.keys(again.block_hashes)
        assert [s.packs for s in meta.saves] == [[(keys[p - p % 4], p % 4) for p in range(8)]]
    finally:
        _native._inject_stall("posix_stat", 0, 0)
    assert wait_for(lambda: b.lookup_store.stalled_for() is None, timeout=5)  # the stuck read returned
    # once the storage answers again, the lookup finds all 8 in their packs
    c = nodes(4, lookup_timeout_s=5)
    assert c.scheduler.get_num_new_matched_tokens(prompt("r3", 8), 0) == (8 * BS, False)


def test_finding_the_packs_and_checking_the_blocks_share_one_lookup_bound(nodes):
    """With packs a lookup is two store calls (the walk over the packs' headers, then the
    presence of every rank's keys): on a slow mount each fits the bound alone but not both
    together, and the lookup still waits its bound once (a miss), not the bound twice."""
    import time

    from ucm_store import _native

    save_one_prompt(nodes(4))
    b = nodes(4, lookup_timeout_s=0.7)
    # every header read takes 0.3 s: the walk reads 2 (0.6 s, inside the bound), the
    # presence check would read them again
    _native._inject_stall("posix_stat", 8, 300)
    try:
        t0 = time.perf_counter()
        assert b.scheduler.get_num_new_matched_tokens(prompt("r2", 8), 0) == (0, False)
        waited = time.perf_counter() - t0
        assert 0.65 <= waited < 0.85, f"the lookup waited {waited:.2f} s, its bound 0.7 s"
        assert b.scheduler.take_lookup_errors() == {"lookup_errors": 1, "lookup_errors_timeout": 1}
    finally:
        _native._inject_stall("posix_stat", 0, 0)
    assert wait_for(lambda: b.lookup_store.stalled_for() is None, timeout=5)  # the stuck reads returned
    c = nodes(4, lookup_timeout_s=5)
    assert c.scheduler.get_num_new_matched_tokens(prompt("r3", 8), 0) == (8 * BS, False)


def test_without_packs_the_metadata_carries_none(nodes):
    a = nodes(1)
    req = prompt("r1", 3)
    a.scheduler.get_num_new_matched_tokens(req, 0)
    a.scheduler.update_state_after_alloc(req, blocks([1, 2, 3, 4]), 0)
    meta = a.scheduler.build_connector_meta(
        step(new=[new_req("r1", [1, 2, 3, 4], 0)], scheduled={"r1": 2 * BS})
    )
    assert [s.packs for s in meta.saves] == [None]  # saved as computed, a file per block
