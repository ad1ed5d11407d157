"""Task lifetime (every task freed however it is waited on), worker exceptions, temp names."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import ucm_store

from tests.support.blocks import block, empty, key, same

SHARDS = [4096]


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


@pytest.mark.parametrize("how", ["wait", "wait_persisted", "wait+persisted", "persisted+wait"])
def test_every_task_is_freed_however_it_is_waited_on(make_store, how):
    store = make_store(SHARDS)
    keys = [key(i, "free") for i in range(50)]
    tids = []
    for k in keys:
        tid = store.dump([k], [block(k, SHARDS)])
        tids.append(tid)
        if how in ("wait", "wait+persisted"):
            assert store.wait(tid, timeout=10).all_ok
        if how != "wait":
            assert store.wait_persisted(tid, timeout=10).all_ok
        if how == "persisted+wait":
            # The persisted outcome is the task's last word (persisted implies stored): the
            # store forgot the task, so the memory result is no longer there to fetch.
            with pytest.raises(KeyError, match="already fetched"):
                store.wait(tid, timeout=10)
    assert store.flush(timeout=10)
    if how == "wait":
        # A dump's persisted outcome stays fetchable after wait(), until it is fetched (or
        # 65,536 newer ones finished): fetching it frees the task.
        assert store.stats()["tasks_live"] == len(keys)
        for tid in tids:
            assert store.wait_persisted(tid, timeout=10).all_ok
    assert store.stats()["tasks_live"] == 0
    tid = store.load(keys, [empty(SHARDS) for _ in keys])
    assert store.stats()["tasks_live"] == 1
    assert store.wait(tid, timeout=10).all_ok
    assert store.stats()["tasks_live"] == 0


@pytest.mark.slow  # ~20 s: 100,000 dumps through the cache and the write-through
def test_dump_and_wait_persisted_cycles_do_not_leak(make_store):
    """The connector's wait_persisted mode: 100,000 dumps, each fetched with wait_persisted
    alone (it used to leave every task, and the hold on its buffer, behind)."""
    store = make_store(SHARDS, posix_io_threads=2)
    keys = [key(i, "cycle") for i in range(256)]
    # A fresh buffer object per dump, as the connector's views are: holds on it must go too.
    data = [block(k, SHARDS)[0] for k in keys]
    rss = {}
    for n in range(1, 100_001):
        i = n % len(keys)
        tid = store.dump([keys[i]], [[memoryview(data[i])]])
        assert store.wait_persisted(tid, timeout=10).ok == [True]
        if n in (10_000, 50_000, 100_000):
            rss[n] = rss_bytes()
    assert store.stats()["tasks_live"] == 0
    growth = max(rss[50_000], rss[100_000]) - rss[10_000]
    # A leaked task (+ buffer hold) is several hundred bytes: 90,000 of them would be tens of MiB.
    assert growth < 2 << 20, f"RSS after 10k/50k/100k cycles: {rss}"


FAULTS = """
import json, sys
import ucm_store
from ucm_store import _native
from tests.support.blocks import block, empty, key

SHARDS = [4096]
out = {}
for pipeline in ("Posix", "Cache|Posix"):
    # One cache slot: a pin leaked by the failed write-through would push every later dump
    # around the cache (cache_full).
    cfg = {"store_pipeline": pipeline, "storage_backends": sys.argv[1] + "/" + pipeline[:5],
           "cache_buffer_capacity_gb": 4096 / 2**30}
    with ucm_store.Store.from_config(cfg, SHARDS) as store:
        _native._inject_fault("posix_write", 1)
        res = {"ok": [], "errors": [], "persisted": [], "persist_errors": []}
        for k in [key(i, pipeline) for i in range(3)]:  # one at a time: the first one fails
            tid = store.dump([k], [block(k, SHARDS)])
            r = store.wait(tid, timeout=10)
            p = store.wait_persisted(tid, timeout=10)
            res["ok"] += r.ok
            res["errors"] += r.errors
            res["persisted"] += p.ok
            res["persist_errors"] += p.errors
        res["flushed"] = store.flush(10)
        res["cache_full"] = store.stats().get("cache_full", 0)
        _native._inject_fault("posix_read", 1)
        loaded = store.wait(store.load([key(2, pipeline)], [empty(SHARDS)]), timeout=10)
        res["load"] = loaded.errors
        more = [key(i, pipeline + "more") for i in range(8)]
        res["again"] = store.wait_persisted(store.dump(more, [block(k, SHARDS) for k in more])).ok
        res["stats"] = store.stats()
        _native._inject_fault("posix_read", 0)
        out[pipeline] = res
print(json.dumps(out))
"""


def test_worker_exception_fails_the_block_and_the_process_lives(tmp_path):
    # In a child process: before the fix the exception ended it (std::terminate).
    run = subprocess.run(
        [sys.executable, "-c", FAULTS, str(tmp_path)],
        cwd=Path(__file__).resolve().parents[3],  # `tests` imports from the checkout's root
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr
    out = json.loads(run.stdout.splitlines()[-1])
    injected = "internal error: injected fault at posix write"
    posix, cached = out["Posix"], out["Cache|Posix"]
    # Posix: the write is the dump itself, so both outcomes of that block fail.
    assert posix["ok"] == [False, True, True] and posix["errors"][0] == injected
    # Cache|Posix: the block is in DRAM; only its write-through failed.
    assert cached["ok"] == [True, True, True]
    for res in (posix, cached):
        assert res["persisted"] == [False, True, True]
        assert res["persist_errors"][0] == injected
        assert res["flushed"] is True  # the failed block is not counted as pending forever
        assert res["again"] == [True] * 8  # the store keeps working
        assert res["stats"]["tasks_live"] == 0
    assert cached["cache_full"] == 0  # the failed write-through released its pin
    assert posix["load"] == ["internal error: injected fault at posix read"]
    assert cached["load"] == [""]  # served from the cache, no read to fail
    assert posix["stats"]["job_errors"] == 2 and cached["stats"]["job_errors"] == 1


def test_two_stores_in_one_process_write_the_same_keys_concurrently(tmp_path):
    # Temp names are <key>.tmp.<host>.<pid>.<counter>: a per-store counter gave both stores
    # the same name for the same key, and the second O_EXCL create failed with EEXIST (before
    # the fix: about 50 of these 512 writes). fsync keeps each write open long enough to overlap.
    cfg = {"store_pipeline": "Posix", "storage_backends": str(tmp_path / "b0"), "io_fsync": True}
    stores = [ucm_store.Store.from_config(cfg, SHARDS) for _ in range(2)]
    try:
        keys = [key(i, "two") for i in range(256)]
        data = [block(k, SHARDS) for k in keys]
        tids = [s.dump(keys, data) for s in stores]  # both stores write every key at once
        failures = [e for s, t in zip(stores, tids, strict=True) for e in s.wait(t, timeout=120).errors if e]
        assert failures == [], f"{len(failures)} failed writes, e.g. {failures[0]}"
        out = [empty(SHARDS) for _ in keys]
        assert stores[0].wait(stores[0].load(keys, out)).all_ok
        assert all(same(o, d) for o, d in zip(out, data, strict=True))
    finally:
        for s in stores:
            s.close()


def test_fault_hook_rejects_unknown_sites():
    with pytest.raises(ValueError, match="unknown fault site"):
        ucm_store._native._inject_fault("nowhere", 1)


def test_waiting_on_a_key_being_filled_does_not_stall_other_work(make_store):
    # Many dumps of one key at once: every one waits for the single fill, then reports its
    # own write-through; all succeed and nothing is left pending.
    shards = [1 << 20]
    store = make_store(shards, cache_prefault=False, cache_buffer_capacity_gb=0.05)
    k = key(0, "same")
    data = block(k, shards)
    t0 = time.monotonic()
    tids = [store.dump([k], [data]) for _ in range(40)]
    assert all(store.wait(t, timeout=30).all_ok for t in tids)
    assert all(store.wait_persisted(t, timeout=30).all_ok for t in tids)
    assert time.monotonic() - t0 < 30
    assert store.stats()["tasks_live"] == 0
    out = empty(shards)
    assert store.wait(store.load([k], [out])).all_ok and same(out, data)
    assert np.array_equal(out[0], data[0])


PREFAULT = r"""
import json, sys
import ucm_store
def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096
out = {}
for prefault in (True, False):
    before = rss()
    cfg = {"store_pipeline": "Posix", "storage_backends": sys.argv[1], "posix_io_threads": 4}
    store = ucm_store.Store.from_config(cfg, shard_sizes=[2 << 20] * 4, io_prefault=prefault)
    out[str(prefault)] = rss() - before
    store.close()
print(json.dumps(out))
"""


def test_opening_faults_in_the_io_threads_read_buffers_unless_told_not_to(tmp_path):
    """The first loads after a store opens must not pay for their I/O threads' read buffers
    (huge pages faulted in while memory is compacted: ~0.2 s for 8 threads of 16 MiB blocks,
    benchmarks/RESULTS.md): the store faults them in when it opens, a block file's bytes per
    I/O thread; a store that only looks up (the connector's scheduler side) is opened without."""
    run = subprocess.run(
        [sys.executable, "-c", PREFAULT, str(tmp_path)], capture_output=True, text=True, timeout=120
    )
    assert run.returncode == 0, run.stderr
    grew = {k: v >> 20 for k, v in json.loads(run.stdout).items()}  # MiB
    assert grew["True"] >= 4 * 8, grew  # 4 threads, blocks of 8 MiB
    assert grew["False"] < 8, grew
