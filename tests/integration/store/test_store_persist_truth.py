"""A dump reported persisted is on disk, even when the same key is dumped while in flight.

The second dump of a key whose DRAM slot another dump is still filling must not borrow a
"persisted" it has not earned: it waits for the bytes to be in DRAM, then answers with its own
write-through. Checked against a backend removed under the store and a full filesystem.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import ucm_store

from tests.support.blocks import block, empty, key, same

# 4 MiB blocks into a cache that is not prefaulted: copying one into its slot takes long
# enough (page faults included) that the second dump of a key often finds the first one's slot
# still filling, the case under test (before the fix: 5-25 of 120 tasks falsely persisted).
SHARDS = [1 << 20] * 4
PAIRS = 60
CACHE = {"cache_buffer_capacity_gb": 0.25, "cache_prefault": False}


def dump_pairs(store: ucm_store.Store, keys: list[bytes]) -> list[tuple[bytes, int]]:
    """Dumps every key twice back to back, all without waiting; returns (key, task) per dump."""
    tasks: list[tuple[bytes, int]] = []
    for k in keys:
        data = block(k, SHARDS)
        tasks += [(k, store.dump([k], [data])), (k, store.dump([k], [data]))]
    return tasks


def early_waits(store: ucm_store.Store, keys: list[bytes]) -> int:
    """How many second dumps of a key in flight returned from wait() before their block was
    readable from the cache (wait() means "the bytes are in DRAM")."""
    early = 0
    for k in keys:
        data = block(k, SHARDS)
        first = store.dump([k], [data])
        second = store.dump([k], [data])
        assert store.wait(second, timeout=30).all_ok
        early += store.lookup([k], tier="Cache") != [True]
        assert store.wait(first, timeout=30).all_ok
        store.wait_persisted(first, timeout=30)
        store.wait_persisted(second, timeout=30)
    return early


def test_duplicate_in_flight_dumps_are_not_persisted_without_a_backend(tmp_path):
    cfg = {"storage_backends": str(tmp_path / "b0"), **CACHE}
    with ucm_store.Store.from_config(cfg, shard_sizes=SHARDS) as store:
        shutil.rmtree(tmp_path / "b0")
        keys = [key(i, "gone") for i in range(PAIRS)]
        tasks = dump_pairs(store, keys)
        persisted = [store.wait_persisted(tid, timeout=30) for _, tid in tasks]
        false_persisted = sum(r.ok[0] for r in persisted)
        assert false_persisted == 0, f"{false_persisted} of {len(tasks)} tasks claim persisted"
        assert all("is missing" in r.errors[0] for r in persisted)
        # Every block is still served from DRAM.
        out = [empty(SHARDS) for _ in keys]
        assert store.wait(store.load(keys, out)).all_ok
        assert all(same(o, block(k, SHARDS)) for o, k in zip(out, keys, strict=True))
        early = early_waits(store, [key(i, "gone-wait") for i in range(PAIRS)])
        assert early == 0, f"{early} of {PAIRS} second dumps returned before the bytes were in DRAM"
        assert store.stats()["tasks_live"] == 0


def _run(*cmd: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60)


@pytest.fixture
def small_ext4(tmp_path: Path) -> Iterator[Path]:
    """A 32 MiB ext4 filesystem on a loop device, mounted at tmp_path/mnt (about 7 blocks)."""
    if os.geteuid() != 0:
        pytest.skip("needs root to attach a loop device and mount a filesystem")
    image, mnt = tmp_path / "fs.img", tmp_path / "mnt"
    with open(image, "wb") as f:
        f.truncate(32 << 20)
    mnt.mkdir()
    mkfs = _run("mkfs.ext4", "-q", "-F", "-m", "0", str(image))
    if mkfs.returncode != 0:
        pytest.skip(f"mkfs.ext4 failed: {mkfs.stderr.strip()}")
    loop = _run("losetup", "--find", "--show", str(image))
    if loop.returncode != 0:
        pytest.skip(f"no loop device: {loop.stderr.strip()}")
    dev = loop.stdout.strip()
    try:
        mount = _run("mount", dev, str(mnt))
        if mount.returncode != 0:
            pytest.skip(f"cannot mount {dev}: {mount.stderr.strip()}")
        try:
            yield mnt
        finally:
            if _run("umount", str(mnt)).returncode != 0:
                _run("umount", "-l", str(mnt))
    finally:
        _run("losetup", "-d", dev)


def test_duplicate_in_flight_dumps_on_a_full_disk_persist_only_what_is_on_disk(small_ext4):
    backend = small_ext4 / "store"
    cfg = {"storage_backends": str(backend), **CACHE}
    keys = [key(i, "full") for i in range(100)]  # 400 MiB for a 32 MiB filesystem
    with ucm_store.Store.from_config(cfg, shard_sizes=SHARDS) as store:
        tasks = dump_pairs(store, keys)
        claims = [(k, store.wait_persisted(tid, timeout=60)) for k, tid in tasks]
        live = store.stats().get("tasks_live")
    persisted = {k for k, r in claims if r.ok[0]}
    failures = [r.errors[0] for _, r in claims if not r.ok[0]]
    assert persisted and failures, "the disk should have taken some blocks and refused others"
    assert all("No space left on device" in e for e in failures), failures[:3]
    # The truth is what a fresh store, opened on the backend alone, can read back.
    posix_only = {"store_pipeline": "Posix", "storage_backends": str(backend)}
    with ucm_store.Store.from_config(posix_only, shard_sizes=SHARDS) as fresh:
        claimed = sorted(persisted)
        out = [empty(SHARDS) for _ in claimed]
        res = fresh.wait(fresh.load(claimed, out), timeout=60)
        false_persisted = sum(not ok for ok in res.ok)
        wrong_bytes = sum(not same(o, block(k, SHARDS)) for o, k in zip(out, claimed, strict=True))
    assert false_persisted == 0, f"{false_persisted} keys reported persisted are not readable"
    assert wrong_bytes == 0
    assert live == 0
