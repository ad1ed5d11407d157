"""Crash and contention: kill -9 writers mid-dump, and several processes writing one key set."""

from __future__ import annotations

import os
import random
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import ucm_store

from tests.integration.store.writer import SHARDS
from tests.support.blocks import block, empty, key, same

ROOT = Path(__file__).resolve().parents[3]  # the writer imports `tests` from the checkout's root


def spawn(*args: object) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "tests.integration.store.writer", *map(str, args)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def temps(root: Path) -> list[Path]:
    return [p for p in root.rglob("*.tmp.*") if p.is_file()]


def verify_all(backend: Path, ns: str, ids: range) -> tuple[int, ucm_store.Store]:
    """Loads every present block of `ids`; each must load and match. Returns how many."""
    store = ucm_store.Store.from_config(
        {"store_pipeline": "Posix", "storage_backends": str(backend), "io_direct": True},
        shard_sizes=SHARDS,
    )
    keys = [key(i, ns) for i in ids]
    present = [k for k, hit in zip(keys, store.lookup(keys), strict=True) if hit]
    out = [empty(SHARDS, 0x77) for _ in present]
    res = store.wait(store.load(present, out), timeout=120)
    assert res.all_ok, [e for e in res.errors if e][:5]
    bad = [k.hex() for k, o in zip(present, out, strict=True) if not same(o, block(k, SHARDS))]
    assert bad == []
    assert store.stats()["corrupt_blocks"] == 0
    return len(present), store


@pytest.mark.slow
@pytest.mark.parametrize("pipeline", ["Posix", "Cache|Posix"])
def test_kill_9_writers_leave_only_whole_blocks(tmp_path, pipeline):
    backend = tmp_path / "store"
    rng = random.Random(1234)
    per_writer, rounds, writers = 50_000, 2, 3  # more than they can write before the kill
    for r in range(rounds):
        procs = [
            spawn(backend, pipeline, "crash", (r * writers + w) * per_writer, per_writer, 25)
            for w in range(writers)
        ]
        # Let each write for a while (they are mid-batch by then), then kill without warning.
        for p in procs:
            assert p.stdout is not None
            line = p.stdout.readline()
            assert line.startswith("batch"), line
        time.sleep(rng.uniform(0.2, 0.6))
        for p in procs:
            p.send_signal(signal.SIGKILL)
        for p in procs:
            p.wait(timeout=30)
            assert p.returncode == -signal.SIGKILL, "writer finished before the kill"
    left = temps(backend)
    count, store = verify_all(backend, "crash", range(rounds * writers * per_writer))
    try:
        assert count > 0
        assert count < rounds * writers * per_writer  # killed before the end
        # The dead writers' temp files are reclaimed; no block is lost in the process.
        # (The store's start-up pass may already have done it.)
        report = store.collect_garbage()
        assert store.stats()["temps_reclaimed"] == len(left)
        assert temps(backend) == []
        assert report["blocks"] == count
    finally:
        store.close()


@pytest.mark.slow
def test_four_processes_dump_the_same_keys_at_once(tmp_path):
    backend = tmp_path / "store"
    go = tmp_path / "go"
    n = 800
    procs = [spawn(backend, "Posix", "same", 0, n, 40, go, seed) for seed in range(4)]
    time.sleep(1.0)  # all imported and opened
    go.touch()
    outs = [p.communicate(timeout=120)[0] for p in procs]
    assert [p.returncode for p in procs] == [0] * 4, outs
    written = skipped = 0
    for out in outs:
        m = re.search(r"done failed 0 written (\d+) skipped (\d+)", out)
        assert m, out
        written += int(m.group(1))
        skipped += int(m.group(2))
    # Every block dumped by each process was either written or found already there.
    assert written + skipped == 4 * n
    assert written >= n
    count, store = verify_all(backend, "same", range(n))
    store.close()
    assert count == n
    assert temps(backend) == []
    files = [p for p in backend.rglob("*") if p.is_file()]
    assert len(files) == n


def _mount_tmpfs(path: Path, size: str) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root to mount a small tmpfs (CI runs as root)")
    path.mkdir()
    rc = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
        capture_output=True,
        text=True,
    )
    if rc.returncode != 0:
        pytest.skip(f"cannot mount tmpfs here: {rc.stderr.strip()}")


@pytest.fixture
def small_disk(tmp_path):
    mnt = tmp_path / "small"
    _mount_tmpfs(mnt, "2m")
    yield mnt
    subprocess.run(["umount", "-l", str(mnt)], check=False)


@pytest.mark.parametrize("pipeline", ["Posix", "Cache|Posix"])
def test_disk_full_fails_dumps_keeps_committed_blocks(small_disk, pipeline):
    shards = [64 * 1024, 64 * 1024]  # 132 KiB files: a 2 MiB disk holds 15
    cfg = {"store_pipeline": pipeline, "storage_backends": str(small_disk / "b")}
    cfg["cache_buffer_capacity_gb"] = 0.01
    store = ucm_store.Store.from_config(cfg, shard_sizes=shards)
    try:
        keys = [key(i, "full") for i in range(30)]
        data = [block(k, shards) for k in keys]
        tid = store.dump(keys, data)
        res = store.wait(tid, timeout=60)
        outcome = store.wait_persisted(tid, timeout=60)
        if pipeline == "Cache|Posix":
            assert res.all_ok  # the DRAM tier took them all
        else:
            assert outcome.ok == res.ok
        stored = [k for k, ok in zip(keys, outcome.ok, strict=True) if ok]
        failed = [e for e in outcome.errors if e]
        assert 5 <= len(stored) < 30
        assert failed and all("No space left on device" in e for e in failed)
        assert temps(small_disk) == []  # failed writers cleaned up after themselves
        # Everything committed before the disk filled up is intact.
        fresh = ucm_store.Store.from_config({**cfg, "store_pipeline": "Posix"}, shard_sizes=shards)
        out = [empty(shards) for _ in stored]
        assert fresh.wait(fresh.load(stored, out)).all_ok
        assert all(same(o, block(k, shards)) for k, o in zip(stored, out, strict=True))
        assert fresh.lookup(keys) == outcome.ok
        fresh.close()
        # Free space and the same store works again.
        for p in list((small_disk / "b").rglob("*"))[:]:
            if p.is_file():
                p.unlink()
        retry = [k for k, ok in zip(keys, outcome.ok, strict=True) if not ok][:5]
        tid = store.dump(retry, [block(k, shards) for k in retry])
        assert store.wait(tid).all_ok and store.wait_persisted(tid, timeout=30).all_ok
        assert store.lookup(retry, tier="Posix") == [True] * len(retry)
    finally:
        store.close()
