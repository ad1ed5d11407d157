"""Giving up on a task (`Store.cancel`): a late read never lands in memory the caller gave up.

The stalls are the store's own test hook (`_inject_stall`): the next N reads or writes sleep
first, as a call into a network filesystem that stopped answering does, then do their I/O;
disarming the hook is the mount answering again (the stalled calls return at once).
The same behaviour against a real stalled GlusterFS mount is tested in
tests/integration/store/test_store_netfs.py.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import numpy as np
import pytest
from ucm_store import _native

from tests.support.blocks import block, empty, key, same
from tests.support.processes import wait_for

SHARDS = [4096, 8192]
SLOT_GB = sum(SHARDS) / 2**30


@pytest.fixture(autouse=True)
def _disarm() -> Iterator[None]:
    yield
    _native._inject_stall("posix_read", 0, 0)
    _native._inject_stall("posix_write", 0, 0)
    _native._inject_stall("posix_stat", 0, 0)


def _stored(make_store, k: bytes, **cfg: object) -> None:
    writer = make_store(SHARDS, **cfg)
    assert writer.wait_persisted(writer.dump([k], [block(k, SHARDS)]), timeout=10).all_ok


@pytest.mark.parametrize("pipeline", ["Posix", "Cache|Posix"])
def test_a_read_that_returns_after_cancel_leaves_the_reused_buffer_alone(make_store, pipeline):
    k = key(1, "late")
    _stored(make_store, k, store_pipeline="Posix")
    reader = make_store(SHARDS, store_pipeline=pipeline, cache_buffer_capacity_gb=8 * SLOT_GB)
    _native._inject_stall("posix_read", 1, 1500)
    target = empty(SHARDS)
    tid = reader.load([k], [target])
    t0 = time.monotonic()
    with pytest.raises(TimeoutError):
        reader.wait(tid, timeout=0.2)
    res = reader.cancel(tid, "load timed out after 0.2 s")
    assert time.monotonic() - t0 < 1.0  # the cancel did not wait for the stalled read
    assert res.ok == [False] and res.errors == ["load timed out after 0.2 s"]
    # The caller (vLLM) hands the block to another request, which writes its own KV there.
    for shard in target:
        shard[:] = 0x5A
    assert wait_for(lambda: reader.stats()["load_late"] == 1), reader.stats()
    stats = reader.stats()
    assert all(np.all(shard == 0x5A) for shard in target), "the late read wrote into the reused buffer"
    assert stats["load_timeouts"] == 1 and stats["load_errors"] == 1 and stats["posix_hits"] == 1
    again = empty(SHARDS)
    assert reader.wait(reader.load([k], [again]), timeout=10).all_ok
    assert same(again, block(k, SHARDS))
    if pipeline == "Cache|Posix":  # the late read filled the cache: the next load is a DRAM hit
        assert reader.stats()["cache_hits"] == 1 and reader.stats()["posix_hits"] == 1


def test_blocks_given_up_while_queued_are_never_read(make_store):
    keys = [key(i, "queued") for i in range(5)]
    writer = make_store(SHARDS, store_pipeline="Posix")
    assert writer.wait_persisted(writer.dump(keys, [block(k, SHARDS) for k in keys]), timeout=10).all_ok
    reader = make_store(SHARDS, store_pipeline="Posix", posix_io_threads=1)
    _native._inject_stall("posix_read", 1, 800)
    targets = [empty(SHARDS) for _ in keys]
    tid = reader.load(keys, targets)
    with pytest.raises(TimeoutError):
        reader.wait(tid, timeout=0.1)
    res = reader.cancel(tid, "timed out")
    assert res.ok == [False] * 5
    assert wait_for(lambda: reader.stats()["load_late"] == 1)
    # The I/O thread is free again: a read queued after the others runs once they are gone.
    after = empty(SHARDS)
    assert reader.wait(reader.load(keys[:1], [after]), timeout=10).all_ok
    assert same(after, block(keys[0], SHARDS))
    stats = reader.stats()
    # One read was stuck in the filesystem; the four behind it were dropped from the queue
    # (the other read is the one queued after them).
    assert stats["posix_hits"] + stats["posix_misses"] == 1 + 1 and stats["load_timeouts"] == 5
    assert all(np.all(s == 0) for t in targets for s in t)


def test_a_finished_task_cancels_to_its_outcome(make_store):
    k = key(2, "done")
    store = make_store(SHARDS)
    assert store.wait(store.dump([k], [block(k, SHARDS)]), timeout=10).all_ok
    target = empty(SHARDS)
    tid = store.load([k], [target])
    assert wait_for(lambda: store.stats()["cache_hits"] == 1)
    res = store.cancel(tid, "too late to give up")
    assert res.ok == [True] and same(target, block(k, SHARDS))
    assert store.stats()["load_timeouts"] == 0
    with pytest.raises(KeyError):
        store.wait(tid, timeout=1)  # cancel hands out the result once, as wait does


def test_posix_dump_cancel_waits_for_the_write_in_flight_and_drops_the_rest(make_store, tmp_path):
    keys = [key(i, "dumpcancel") for i in range(3)]
    store = make_store(SHARDS, store_pipeline="Posix", posix_io_threads=1)
    _native._inject_stall("posix_write", 1, 700)
    sources = [block(k, SHARDS) for k in keys]
    tid = store.dump(keys, sources)
    with pytest.raises(TimeoutError):
        store.wait(tid, timeout=0.1)
    t0 = time.monotonic()
    res = store.cancel(tid, "dump timed out")
    # Without a cache the write reads the caller's memory: the cancel waits for the one in
    # flight (it then completes), and the two queued blocks are never written.
    assert time.monotonic() - t0 > 0.3
    assert res.ok == [True, False, False] and res.errors[1:] == ["dump timed out"] * 2
    assert store.flush(timeout=10)
    assert store.lookup(keys) == [True, False, False]
    assert store.stats()["dump_timeouts"] == 2


def test_a_full_cache_over_stalled_storage_queues_a_bounded_backlog_then_drops(make_store):
    # Two slots, one I/O thread, every write stalled: the two cached blocks pin their slots
    # until written through, the rest go around the full cache from copies the store owns,
    # queued for the storage up to 64 pending writes; the blocks past that are dropped.
    store = make_store(
        SHARDS, store_pipeline="Cache|Posix", cache_buffer_capacity_gb=2 * SLOT_GB, posix_io_threads=1
    )
    # The storage answers no write until the test disarms the stall: a write that returned
    # while the 70 blocks are still being copied (a loaded machine) would free a place in the
    # backlog, and the count of drops would depend on the machine's speed.
    _native._inject_stall("posix_write", 1000, 600_000)
    keys = [key(i, "full") for i in range(70)]
    sources = [block(k, SHARDS) for k in keys]
    tid = store.dump(keys, sources)
    with pytest.raises(TimeoutError):
        store.wait(tid, timeout=0.5)
    t0 = time.monotonic()
    res = store.cancel(tid, "dump timed out")
    assert time.monotonic() - t0 < 1.0, "the cancel waited for the stalled storage"
    for s in sources:  # the caller reuses its memory: queued writes hold copies of their own
        for shard in s:
            shard[:] = 0
    stats = store.stats()
    assert sum(res.ok) == 2 and stats["dump_dropped"] == 6 and stats["cache_full"] == 68
    dropped = [e for e in res.errors if "block dropped" in e]
    assert len(dropped) == 6 and res.errors.count("dump timed out") == 62
    _native._inject_stall("posix_write", 0, 0)
    assert store.flush(timeout=20)
    # The writes given up by the caller still completed, with the right bytes.
    on_disk = store.lookup(keys, tier="Posix")
    assert sum(on_disk) == 64
    reader = make_store(SHARDS, store_pipeline="Posix")
    stored = [k for k, hit in zip(keys, on_disk, strict=True) if hit]
    targets = [empty(SHARDS) for _ in stored]
    assert reader.wait(reader.load(stored, targets), timeout=10).all_ok
    assert all(same(t, block(k, SHARDS)) for t, k in zip(targets, stored, strict=True))


def test_cancel_of_an_unknown_task_is_a_key_error(make_store):
    store = make_store(SHARDS)
    with pytest.raises(KeyError, match="unknown task"):
        store.cancel(12345)


def test_store_still_serves_after_many_cancels(make_store):
    store = make_store(SHARDS, store_pipeline="Posix", posix_io_threads=2)
    keys = [key(i, "many") for i in range(40)]
    assert store.wait_persisted(store.dump(keys, [block(k, SHARDS) for k in keys]), timeout=10).all_ok
    for k in keys:
        store.cancel(store.load([k], [empty(SHARDS)]), "x")  # racing the reads on purpose
    assert store.stats()["tasks_live"] == 0
    targets = [empty(SHARDS) for _ in keys]
    assert store.wait(store.load(keys, targets), timeout=10).all_ok
    assert all(same(t, block(k, SHARDS)) for t, k in zip(targets, keys, strict=True))


def test_a_bounded_lookup_gives_up_and_later_ones_fail_fast_until_the_storage_answers(make_store):
    k = key(3, "lookup")
    _stored(make_store, k, store_pipeline="Posix")
    store = make_store(SHARDS, store_pipeline="Posix")
    _native._inject_stall("posix_stat", 1, 2000)  # the next stat() hangs 2 s (a stalled mount)
    t0 = time.monotonic()
    with pytest.raises(TimeoutError, match=r"not answered within 0\.2 s"):
        store.lookup_prefix([k], timeout=0.2)
    assert time.monotonic() - t0 < 1.0
    t0 = time.monotonic()
    with pytest.raises(TimeoutError, match="stuck in the storage"):
        store.lookup([k], timeout=0.2)  # refused at once: it would only queue behind the stuck one
    assert time.monotonic() - t0 < 0.5
    assert wait_for(lambda: _lookup_or_none(store, k) == [True], timeout=5)
    assert store.lookup_prefix([k], timeout=1) == 1
    assert store.lookup_prefix([k]) == 1  # unbounded: the native call on the caller's thread


def _lookup_or_none(store, k: bytes) -> list[bool] | None:
    try:
        return store.lookup([k], timeout=1)
    except TimeoutError:
        return None


def test_a_stalled_persist_costs_one_bounded_wait_not_one_per_step(make_store):
    store = make_store(SHARDS, store_pipeline="Cache|Posix", posix_io_threads=1)
    _native._inject_stall("posix_write", 1, 1500)
    a, b, c = (key(i, "persist") for i in range(3))
    t0 = time.monotonic()
    first = store.finish_within(store.dump([a], [block(a, SHARDS)]), 0.3, op="dump", persisted=True)
    assert 0.25 < time.monotonic() - t0 < 1.2 and first.ok == [False]
    assert "not persisted within 0.3 s" in first.errors[0]
    t0 = time.monotonic()
    second = store.finish_within(store.dump([b], [block(b, SHARDS)]), 1.0, op="dump", persisted=True)
    assert time.monotonic() - t0 < 0.5, "a second step waited for a storage known to be stalled"
    assert second.ok == [False] and "the storage is stalled" in second.errors[0]
    assert wait_for(lambda: store.stalled_for() is None, timeout=5)  # the stalled write returned
    third = store.finish_within(store.dump([c], [block(c, SHARDS)]), 5, op="dump", persisted=True)
    assert third.ok == [True] and third.all_ok
    assert store.flush(timeout=10)
    assert store.lookup([a, b, c], tier="Posix") == [True, True, True]  # late, but all written


def test_one_stall_found_by_a_lookup_or_a_persist_spares_the_other_its_wait(make_store):
    store = make_store(SHARDS, store_pipeline="Cache|Posix", posix_io_threads=1)
    a, b = key(10, "cross"), key(11, "cross")
    _native._inject_stall("posix_stat", 1, 1200)
    with pytest.raises(TimeoutError):
        store.lookup_prefix([a], timeout=0.2)
    assert store.stalled_for() is not None
    t0 = time.monotonic()
    res = store.finish_within(store.dump([a], [block(a, SHARDS)]), 2, op="dump", persisted=True)
    assert time.monotonic() - t0 < 1.0 and res.ok == [False]  # no persist wait: known stalled
    assert wait_for(lambda: store.stalled_for() is None, timeout=5)  # the stuck lookup returned
    _native._inject_stall("posix_write", 1, 1200)
    res = store.finish_within(store.dump([b], [block(b, SHARDS)]), 0.2, op="dump", persisted=True)
    assert res.ok == [False] and store.stalled_for() is not None
    t0 = time.monotonic()
    with pytest.raises(TimeoutError, match="lookup not tried"):
        store.lookup([b], timeout=2)  # refused at once: a write is stuck in the storage
    assert time.monotonic() - t0 < 1.0
    assert wait_for(lambda: store.stalled_for() is None, timeout=5)
    assert store.flush(timeout=5)
    assert store.lookup_prefix([a, b], timeout=2) == 2  # answers again: both were written


def test_a_persist_with_no_write_returning_is_a_stall_after_stall_s_while_slow_writes_get_the_bound(
    make_store,
):
    """`stall_s`: storage that stopped costs stall_s, not the dump bound; storage that is slow
    but moving (each write 0.25 s, six of them: 1.5 s in all) gets the whole bound."""
    store = make_store(SHARDS, store_pipeline="Cache|Posix", posix_io_threads=1)
    _native._inject_stall("posix_write", 1, 2000)
    a = key(0, "progress")
    t0 = time.monotonic()
    stalled = store.finish_within(
        store.dump([a], [block(a, SHARDS)]), 5, op="dump", persisted=True, stall_s=0.4
    )
    took = time.monotonic() - t0
    assert 0.35 < took < 1.5, took  # stall_s, with room for a loaded machine; the bound was 5 s
    assert stalled.ok == [False] and "no write returned for 0.4 s" in stalled.errors[0]
    assert store.stalled_for() is not None  # later steps do not wait either
    assert wait_for(lambda: store.stalled_for() is None, timeout=5)  # the stuck write returned
    _native._inject_stall("posix_write", 6, 250)
    keys = [key(i, "slow") for i in range(6)]
    slow = store.finish_within(
        store.dump(keys, [block(k, SHARDS) for k in keys]), 10, op="dump", persisted=True, stall_s=0.4
    )
    assert slow.all_ok, slow.errors  # 1.5 s of writes, none longer than 0.4 s: not a stall


@pytest.mark.parametrize("pipeline", ["Posix", "Cache|Posix"])
def test_a_load_with_no_read_returning_is_a_stall_after_stall_s_while_slow_reads_get_the_bound(
    make_store, pipeline
):
    """The same for loads: one read stuck for 2 s is given up after stall_s (0.4 s), not the
    bound (5 s); six reads of 0.25 s each (1.5 s in all, each within stall_s) all land."""
    keys = [key(i, "read-progress") for i in range(7)]
    writer = make_store(SHARDS, store_pipeline="Posix")
    assert writer.wait_persisted(writer.dump(keys, [block(k, SHARDS) for k in keys]), timeout=10).all_ok
    reader = make_store(
        SHARDS, store_pipeline=pipeline, posix_io_threads=1, cache_buffer_capacity_gb=16 * SLOT_GB
    )
    _native._inject_stall("posix_read", 1, 2000)
    target = empty(SHARDS)
    t0 = time.monotonic()
    stalled = reader.finish_within(reader.load(keys[:1], [target]), 5, op="load", stall_s=0.4)
    took = time.monotonic() - t0
    assert 0.35 < took < 1.5, took  # stall_s, with room for a loaded machine
    assert stalled.ok == [False], stalled
    assert stalled.errors[0].startswith("load timed out after 0."), stalled.errors
    assert stalled.errors[0].endswith("of its 5 s bound (the storage is stalled: no read returned for 0.4 s)")
    for shard in target:  # vLLM gives the block to another request
        shard[:] = 0x5A
    assert wait_for(lambda: reader.stats()["load_late"] == 1), reader.stats()
    assert all(np.all(shard == 0x5A) for shard in target), "the late read wrote into the reused buffer"
    _native._inject_stall("posix_read", 6, 250)
    targets = [empty(SHARDS) for _ in keys[1:]]
    t0 = time.monotonic()
    slow = reader.finish_within(reader.load(keys[1:], targets), 10, op="load", stall_s=0.4)
    assert slow.all_ok, slow.errors  # 1.5 s of reads, none longer than 0.4 s: not a stall
    assert time.monotonic() - t0 >= 1.4
    assert all(same(t, block(k, SHARDS)) for t, k in zip(targets, keys[1:], strict=True))
