"""Round trips, lookups, task semantics and LRU eviction through the Python binding."""

from __future__ import annotations

import ctypes
import os

import numpy as np
import pytest
import ucm_store

from tests.support.blocks import block, empty, key, same
from ucmctl.core.pack_heads import pack_refs

SHARDS = [4096, 1000, 8192, 3]  # odd sizes exercise padding and unaligned tails


@pytest.mark.parametrize("pipeline", ["Cache|Posix", "Posix", "Cache"])
@pytest.mark.parametrize("io_direct", [False, True])
def test_round_trip_random_blocks(make_store, pipeline, io_direct):
    store = make_store(SHARDS, store_pipeline=pipeline, io_direct=io_direct)
    keys = [key(i) for i in range(40)]
    data = [block(k, SHARDS) for k in keys]
    res = store.wait(store.dump(keys, data), timeout=30)
    assert res.ok == [True] * 40 and res.errors == [""] * 40 and res.all_ok
    assert store.flush(timeout=30)
    out = [empty(SHARDS, 0xEE) for _ in keys]
    res = store.wait(store.load(keys, out), timeout=30)
    assert res.all_ok, res
    assert all(same(a, b) for a, b in zip(data, out, strict=True))
    st = store.stats()
    assert st["dump_blocks"] == 40 and st["load_blocks"] == 40
    if pipeline == "Posix":
        assert st["posix_blocks_written"] == 40 and st["posix_blocks_read"] == 40
    else:
        assert st["cache_hits"] == 40 and st["cache_bytes_read"] == 40 * sum(SHARDS)


def test_posix_blocks_survive_reopen_and_fill_cache(make_store):
    keys = [key(i) for i in range(10)]
    data = [block(k, SHARDS) for k in keys]
    first = make_store(SHARDS, store_pipeline="Posix")
    assert first.wait(first.dump(keys, data)).all_ok
    first.close()
    store = make_store(SHARDS)  # Cache|Posix over the same directory, empty cache
    assert store.lookup(keys, tier="Cache") == [False] * 10
    out = [empty(SHARDS) for _ in keys]
    assert store.wait(store.load(keys, out)).all_ok
    assert all(same(a, b) for a, b in zip(data, out, strict=True))
    assert store.stats()["posix_hits"] == 10
    assert store.lookup(keys, tier="Cache") == [True] * 10  # cache_on_load populated it


def test_address_tuples_and_buffer_objects(make_store):
    store = make_store([16, 32], store_pipeline="Posix")
    k = key(1)
    src_a = bytes(range(16))
    src_b = bytearray(range(100, 132))
    raw = (ctypes.c_char * 16).from_buffer_copy(src_a)
    tid = store.dump([k], [[(ctypes.addressof(raw), 16), src_b]])
    assert store.wait(tid).all_ok
    dst_a = np.zeros(16, np.uint8)
    dst_b = bytearray(32)
    assert store.wait(store.load([k], [[(dst_a.ctypes.data, 16), memoryview(dst_b)]])).all_ok
    assert bytes(dst_a) == src_a and dst_b == src_b


def test_many_shards_in_one_call_none_lost(make_store):
    # Upstream lost 201 of 8,000 shards in this shape (rename raced the last shard).
    shards = [64 * 1024] * 8
    store = make_store(shards, store_pipeline="Posix", io_direct=True, posix_io_threads=4)
    keys = [key(i, "many") for i in range(120)]
    data = [block(k, shards) for k in keys]
    assert store.wait(store.dump(keys, data)).all_ok
    out = [empty(shards, 0xAB) for _ in keys]
    assert store.wait(store.load(keys, out)).all_ok
    bad = sum(
        not np.array_equal(a, b) for x, y in zip(data, out, strict=True) for a, b in zip(x, y, strict=True)
    )
    assert bad == 0
    root = store.settings.backends[0]
    leftovers = [f for _, _, fs in os.walk(root) for f in fs if ".tmp." in f]
    assert leftovers == []


@pytest.mark.parametrize("direct", [True, False], ids=["o_direct", "buffered"])
def test_large_blocks_round_trip_through_the_huge_page_scratch(make_store, direct):
    # Files of 2 MiB and more are read through a 2 MiB-aligned huge-page buffer; odd shard
    # sizes (not whole pages) take the staging path on the way in.
    shards = [1 << 20, 1 << 20, 5000, 1 << 20]
    store = make_store(shards, store_pipeline="Posix", io_direct=direct)
    keys = [key(i, f"big{direct}") for i in range(12)]
    data = [block(k, shards) for k in keys]
    assert store.wait(store.dump(keys, data)).all_ok
    out = [empty(shards, 0xCD) for _ in keys]
    assert store.wait(store.load(keys, out)).all_ok
    assert all(same(o, d) for o, d in zip(out, data, strict=True))
    assert store.stats()["posix_blocks_read"] == 12


def test_lookup_prefix_semantics(make_store):
    store = make_store([512], store_pipeline="Posix")
    present = [key(i, "p") for i in range(1000)]
    assert store.wait(store.dump(present, [block(k, [512]) for k in present])).all_ok
    missing = key(0, "missing")
    assert store.lookup_prefix([]) == 0
    assert store.lookup_prefix(present[:5]) == 5
    assert store.lookup_prefix([missing, *present[:5]]) == 0
    assert store.lookup_prefix([*present[:2], missing, present[3]]) == 2
    # Large batches take the parallel path: the answer must still stop at the first miss.
    assert store.lookup_prefix(present) == 1000
    assert store.lookup_prefix([*present[:700], missing, *present[700:]]) == 700
    assert store.lookup_prefix([*present[:999], missing]) == 999
    assert store.lookup([present[0], missing, present[1]]) == [True, False, True]
    many = [missing if i % 3 == 0 else present[i] for i in range(1000)]
    assert store.lookup(many) == [i % 3 != 0 for i in range(1000)]


def test_lru_eviction_keeps_recently_used(make_store):
    shards = [4096]
    store = make_store(shards, cache_buffer_capacity_gb=4 * 4096 / 2**30)  # exactly 4 slots
    assert store.stats()["cache_slots"] == 4
    keys = [key(i, "lru") for i in range(6)]
    data = {k: block(k, shards) for k in keys}
    for k in keys[:4]:
        assert store.wait(store.dump([k], [data[k]])).all_ok
    assert store.flush(10)  # write-through done: slots are unpinned and evictable
    assert store.wait(store.load([keys[0]], [empty(shards)])).all_ok  # keys[0] now MRU
    assert store.wait(store.dump([keys[4]], [data[keys[4]]])).all_ok
    assert store.lookup(keys[:5], tier="Cache") == [True, False, True, True, True]
    assert store.stats()["cache_evictions"] == 1
    assert store.flush(10)
    assert store.wait(store.dump([keys[5]], [data[keys[5]]])).all_ok
    assert store.lookup(keys, tier="Cache") == [True, False, False, True, True, True]
    # Evicted blocks are still served from Posix.
    out = empty(shards)
    assert store.wait(store.load([keys[1]], [out])).all_ok and same(out, data[keys[1]])
    assert store.stats()["posix_hits"] == 1


def test_pinned_cache_falls_back_to_posix(make_store):
    shards = [4096]
    # One slot, write-through pinned: the second dump must still succeed, straight to disk.
    store = make_store(shards, cache_buffer_capacity_gb=4096 / 2**30, posix_io_threads=1)
    keys = [key(i, "pin") for i in range(30)]
    data = [block(k, shards) for k in keys]
    assert store.wait(store.dump(keys, data)).all_ok
    assert store.flush(10)
    assert store.lookup(keys, tier="Posix") == [True] * 30
    out = [empty(shards) for _ in keys]
    assert store.wait(store.load(keys, out)).all_ok
    assert all(same(a, b) for a, b in zip(data, out, strict=True))


def test_task_results_are_fetched_once(make_store):
    store = make_store([64], store_pipeline="Posix")
    tid = store.dump([key(1)], [block(key(1), [64])])
    res = store.wait(tid, timeout=10)
    assert res.ok == [True]
    with pytest.raises(KeyError, match="unknown task"):
        store.wait(tid)
    with pytest.raises(KeyError):
        store.check(12345)
    tid = store.load([key(2)], [empty([64])])
    res = None
    for _ in range(1000):
        res = store.check(tid)
        if res is not None:
            break
    assert res is not None and res.ok == [False] and res.errors == ["not found"]
    assert store.wait(store.dump([], [])).ok == []


def test_wait_persisted_and_flush(make_store):
    shards = [8192, 8192]
    store = make_store(shards)
    keys = [key(i, "wp") for i in range(20)]
    tid = store.dump(keys, [block(k, shards) for k in keys])
    assert store.wait(tid).all_ok
    persisted = store.wait_persisted(tid, timeout=30)
    assert persisted.ok == [True] * 20
    assert store.lookup(keys, tier="Posix") == [True] * 20
    with pytest.raises(KeyError):
        store.wait_persisted(tid)  # fetched once
    # each block is counted out of the pending ones just after its waiter hears of it: a flush
    # right after wait_persisted may find the last one still counted (seen under load: CI)
    assert store.flush(timeout=5000) is True
    assert store.flush(timeout=0) is True  # nothing pending now


def test_timeout_raises_and_task_stays_waitable(make_store):
    shards = [1 << 20]
    store = make_store(shards, store_pipeline="Posix", posix_io_threads=1, io_fsync=True)
    keys = [key(i, "slow") for i in range(64)]
    tid = store.dump(keys, [block(k, shards) for k in keys])
    with pytest.raises(TimeoutError, match=f"task {tid} still running"):
        store.wait(tid, timeout=0)
    assert store.wait(tid, timeout=60).all_ok


def test_closed_store_refuses_work(make_store):
    store = make_store([64])
    store.close()
    assert store.closed
    with pytest.raises(RuntimeError, match="closed"):
        store.lookup([key(1)])
    store.close()  # idempotent


def test_context_manager_persists_on_close(tmp_path):
    cfg = {"storage_backends": str(tmp_path), "cache_buffer_capacity_gb": 0.01}
    with ucm_store.Store.from_config(cfg, shard_sizes=[4096]) as store:
        assert store.wait(store.dump([key(7)], [block(key(7), [4096])])).all_ok
    with ucm_store.Store.from_config({**cfg, "store_pipeline": "Posix"}, [4096]) as store:
        assert store.lookup([key(7)]) == [True]


# A block of 1 MiB and more is copied out with streaming stores (csrc/copy_out.cpp): every
# start alignment within a cache line and every tail length below one, and not a byte past the
# buffer on either side.
BIG = [(1 << 20) + 3, 65536 + 61, 7, 200_000]
STARTS = [1, 17, 63, 0]


def guarded(offset: int, n: int) -> tuple[np.ndarray, np.ndarray]:
    """A view of n bytes at `offset` into a 0xEE-filled allocation with 128 spare bytes."""
    whole = np.full(n + 128, 0xEE, dtype=np.uint8)
    base = -whole.ctypes.data % 64  # the view's address is `offset` past a cache line
    return whole, whole[base + offset : base + offset + n]


@pytest.mark.parametrize("path", ["Posix", "Cache", "read_pack", "pack task"])
def test_large_blocks_land_exactly_in_unaligned_buffers(make_store, path):
    store = make_store(BIG, store_pipeline="Cache" if path == "Cache" else "Posix", io_direct=True)
    keys = [key(i, "big") for i in range(3)]
    data = [block(k, BIG) for k in keys]
    packs = pack_refs(keys, range(3), 3, ()) if path == "pack task" else None
    if path == "read_pack":
        assert store.write_pack(keys, data) == ("", 3)
    else:
        tid = store.dump(keys, data, packs=packs)
        assert (store.wait(tid) if path == "Cache" else store.wait_persisted(tid, 30)).all_ok
    for trial in range(len(STARTS)):
        starts = STARTS[trial:] + STARTS[:trial]
        bufs = [[guarded(o, n) for o, n in zip(starts, BIG, strict=True)] for _ in keys]
        out = [[view for _, view in b] for b in bufs]
        if path == "read_pack":
            assert store.read_pack(keys, 0, 3, out) == [""] * 3
        else:
            assert store.wait(store.load(keys, out, packs=packs)).all_ok
        assert all(same(a, b) for a, b in zip(data, out, strict=True))
        for b in bufs:
            for (whole, view), o in zip(b, starts, strict=True):
                lead = view.ctypes.data - whole.ctypes.data
                assert (whole[:lead] == 0xEE).all() and (whole[lead + view.size :] == 0xEE).all()
                assert view.ctypes.data % 64 == o
    if path == "pack task":
        assert store.stats()["posix_packs_read"] == len(STARTS)  # one read of the pack per trial
