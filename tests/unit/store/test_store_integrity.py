"""Corrupt files, failing backends, temp reclamation and capacity collection."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest
import ucm_store

from tests.support.blocks import block, empty, key, same

SHARDS = [4096, 4096, 100]
HEADER = 4096


def block_path(store: ucm_store.Store, k: bytes) -> Path:
    hits = [
        Path(b) / k.hex()[:3] / k.hex()
        for b in store.settings.backends
        if (Path(b) / k.hex()[:3] / k.hex()).exists()
    ]
    assert len(hits) == 1, hits
    return hits[0]


def dumped(make_store, n=3, **cfg):
    store = make_store(SHARDS, store_pipeline="Posix", **cfg)
    keys = [key(i, "c") for i in range(n)]
    data = [block(k, SHARDS) for k in keys]
    assert store.wait(store.dump(keys, data)).all_ok
    return store, keys, data


def flip(path: Path, offset: int) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        b = f.read(1)
        f.seek(offset)
        f.write(bytes([b[0] ^ 0x40]))


@pytest.mark.parametrize(
    ("damage", "reason"),
    [
        (lambda p: flip(p, HEADER + 5000), "payload checksum mismatch"),
        (lambda p: flip(p, HEADER + 4096 * 2 + 99), "payload checksum mismatch"),
        (lambda p: flip(p, 20), "header checksum mismatch"),
        (lambda p: flip(p, 0), "bad magic"),
        (lambda p: os.truncate(p, HEADER + 6000), "truncated"),
        (lambda p: os.truncate(p, 100), "truncated"),
        (lambda p: os.truncate(p, 0), "truncated"),
        (lambda p: os.truncate(p, p.stat().st_size + 4096), "oversized"),
    ],
    ids=["payload", "last-shard", "header", "magic", "torn", "tiny", "empty", "appended"],
)
@pytest.mark.parametrize("io_direct", [False, True])
def test_damaged_block_is_a_failed_load_and_moved_aside(make_store, damage, reason, io_direct):
    store, keys, data = dumped(make_store, io_direct=io_direct)
    victim = block_path(store, keys[1])
    damage(victim)
    out = [empty(SHARDS, 0x5A) for _ in keys]
    res = store.wait(store.load(keys, out))
    assert res.ok == [True, False, True]
    assert reason in res.errors[1] and "corrupt" in res.errors[1]
    assert same(out[0], data[0]) and same(out[2], data[2])
    # Not one byte of the bad block reached the caller's buffer.
    assert all((s == 0x5A).all() for s in out[1])
    assert not victim.exists()
    moved = list((Path(store.settings.backends[0]) / "corrupt").iterdir())
    assert len(moved) == 1 and moved[0].name.startswith(keys[1].hex())
    assert store.lookup(keys) == [True, False, True]
    st = store.stats()
    assert st["corrupt_blocks"] == 1 and st["quarantined_blocks"] == 1
    # The store heals: the block can be dumped again and then loads fine.
    assert store.wait(store.dump([keys[1]], [data[1]])).all_ok
    again = empty(SHARDS)
    assert store.wait(store.load([keys[1]], [again])).all_ok and same(again, data[1])


def test_file_of_another_key_is_rejected(make_store):
    store, keys, _ = dumped(make_store, n=2)
    shutil.copy(block_path(store, keys[0]), block_path(store, keys[1]))
    out = [empty(SHARDS, 1) for _ in keys]
    res = store.wait(store.load(keys, out))
    assert res.ok == [True, False] and "another key" in res.errors[1]
    assert all((s == 1).all() for s in out[1])


def test_other_shard_layout_is_an_error_not_corruption(make_store, tmp_path):
    store, keys, _ = dumped(make_store, n=1)
    store.close()
    other = make_store([4096, 4096, 101], store_pipeline="Posix")
    res = other.wait(other.load(keys, [empty([4096, 4096, 101])]))
    assert res.ok == [False] and "shard layout mismatch" in res.errors[0]
    assert other.stats()["corrupt_blocks"] == 0
    assert other.lookup(keys) == [True]  # a sound file of another layout stays in place


def test_missing_backend_fails_dumps_and_store_recovers(make_store, tmp_path):
    store, _, _ = dumped(make_store)
    backend = Path(store.settings.backends[0])
    shutil.rmtree(backend)
    new = [key(i, "after") for i in range(4)]
    res = store.wait(store.dump(new, [block(k, SHARDS) for k in new]))
    assert res.ok == [False] * 4
    assert all("is missing" in e and str(backend) in e for e in res.errors)
    assert store.stats()["dump_errors"] == 4
    backend.mkdir()
    res = store.wait(store.dump(new, [block(k, SHARDS) for k in new]))
    assert res.all_ok and store.lookup(new) == [True] * 4


def test_unwritable_shard_dir_fails_only_its_blocks(make_store):
    store = make_store(SHARDS, store_pipeline="Posix")
    keys = [key(i, "w") for i in range(50)]
    backend = Path(store.settings.backends[0])
    blocked = keys[0].hex()[:3]
    (backend / blocked).write_text("not a directory")  # EEXIST on mkdir, ENOTDIR on open
    res = store.wait(store.dump(keys, [block(k, SHARDS) for k in keys]))
    expect = [k.hex()[:3] != blocked for k in keys]
    assert res.ok == expect
    assert "Not a directory" in res.errors[0]
    assert store.lookup(keys) == expect


DUMP_ONE = """
import json, sys, ucm_store
store = ucm_store.Store.from_config({"store_pipeline": "Posix", "storage_backends": sys.argv[1]},
                                    shard_sizes=[4096])
res = store.wait(store.dump([bytes(16)], [[bytes(4096)]]))
print(json.dumps({"ok": res.ok, "errors": res.errors}))
"""


def test_permission_denied_is_a_reason(tmp_path):
    backend = tmp_path / "b0"
    backend.mkdir()
    backend.chmod(0o500)
    cmd = [sys.executable, "-c", DUMP_ONE, str(backend)]
    if os.geteuid() == 0:
        # Root ignores directory modes through CAP_DAC_OVERRIDE: run the writer without it.
        setpriv = shutil.which("setpriv")
        if setpriv is None:
            pytest.fail("setpriv (util-linux) is needed to drop root's DAC capabilities")
        cmd = [setpriv, "--bounding-set=-dac_override,-dac_read_search", "--inh-caps=-all", *cmd]
    try:
        run = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    finally:
        backend.chmod(0o755)
    assert run.returncode == 0, run.stderr
    res = json.loads(run.stdout.splitlines()[-1])
    assert res["ok"] == [False]
    assert "Permission denied" in res["errors"][0] and str(backend) in res["errors"][0]
    assert list(backend.iterdir()) == []  # nothing half-written left behind


def test_write_through_failure_is_reported_as_not_persisted(make_store):
    store = make_store(SHARDS)  # Cache|Posix
    shutil.rmtree(store.settings.backends[0])
    tid = store.dump([key(1)], [block(key(1), SHARDS)])
    assert store.wait(tid).all_ok  # in DRAM
    persisted = store.wait_persisted(tid, timeout=10)
    assert persisted.ok == [False] and "is missing" in persisted.errors[0]
    assert store.stats()["persist_errors"] == 1
    out = empty(SHARDS)
    assert store.wait(store.load([key(1)], [out])).all_ok  # still served from the cache


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def test_stale_temps_of_dead_writers_are_reclaimed(make_store):
    store, keys, _ = dumped(make_store)
    shard = block_path(store, keys[0]).parent
    host = socket.gethostname()
    hexkey = keys[0].hex()
    dead = shard / f"{hexkey}.tmp.{host}.{_dead_pid()}.0"
    mine = shard / f"{hexkey}.tmp.{host}.{os.getpid()}.999999"
    remote_fresh = shard / f"{hexkey}.tmp.other.node.example.123.0"
    remote_old = shard / f"{hexkey}.tmp.other.node.example.124.0"
    for p in (dead, mine, remote_fresh, remote_old):
        p.write_bytes(b"partial")
    old = time.time() - 7200
    os.utime(remote_old, (old, old))
    report = store.collect_garbage()
    assert report["temps_reclaimed"] == 2
    assert not dead.exists() and not remote_old.exists()
    assert mine.exists() and remote_fresh.exists()
    assert report["blocks"] == 3
    assert store.lookup(keys) == [True] * 3


def test_capacity_removes_oldest_blocks_first(make_store):
    shards = [4096]
    file_size = 8192  # header page + payload page
    capacity = 20 * file_size
    # Written without a limit (no pass can run before the ages are set), then collected by a
    # store that has one.
    writer = make_store(shards, store_pipeline="Posix")
    keys = [key(i, "gc") for i in range(30)]
    assert writer.wait(writer.dump(keys, [block(k, shards) for k in keys])).all_ok
    # Give every block a distinct age: keys[0] oldest.
    now = time.time()
    for i, k in enumerate(keys):
        t = now - 1000 + i
        os.utime(block_path(writer, k), (t, t))
    store = make_store(shards, store_pipeline="Posix", posix_capacity_gb=capacity / 2**30)
    report = store.collect_garbage()
    # The store's own first pass (it measures what is stored) may have done the work already:
    # judge the outcome, not which pass did it.
    assert report["used_bytes"] <= capacity * 0.9
    assert report["blocks"] == 18  # down to 90% of 20 files
    assert store.stats()["gc_removed_blocks"] == 12
    assert store.lookup(keys) == [False] * 12 + [True] * 18


def test_capacity_is_enforced_in_the_background(make_store):
    shards = [4096]
    capacity = 10 * 8192
    store = make_store(shards, store_pipeline="Posix", posix_capacity_gb=capacity / 2**30)
    keys = [key(i, "bg") for i in range(40)]
    for k in keys:
        assert store.wait(store.dump([k], [block(k, shards)])).all_ok
        # File times come from the kernel's coarse clock (a few ms): space the writes so that
        # "oldest first" has an order to follow.
        time.sleep(0.01)
    deadline = time.time() + 30  # generous: metadata ops stall when the disk is contended
    while time.time() < deadline:
        used = sum(f.stat().st_size for f in Path(store.settings.backends[0]).rglob("*") if f.is_file())
        if used <= capacity:
            break
        time.sleep(0.05)
    assert used <= capacity
    assert store.lookup([keys[-1]]) == [True]


def test_io_direct_on_tmpfs_falls_back_with_a_reason_or_works(make_store):
    # tmpfs refuses O_DIRECT before Linux 6.6 and accepts it since: either way the store must
    # say what it does and still round-trip.
    shm = Path("/dev/shm")
    if not shm.is_dir():
        pytest.skip("/dev/shm (tmpfs) not available")
    backend = shm / f"ucm-store-test-{os.getpid()}"
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            store = make_store([4096], store_pipeline="Posix", io_direct=True, storage_backends=str(backend))
        refused = [str(w.message) for w in caught if "refuses O_DIRECT" in str(w.message)]
        assert store.direct_io() == [not refused]
        assert bool(refused) == any("O_DIRECT" in n for n in store.notes())
        assert store.wait(store.dump([key(1)], [block(key(1), [4096])])).all_ok
        out = empty([4096])
        assert store.wait(store.load([key(1)], [out])).all_ok and same(out, block(key(1), [4096]))
    finally:
        shutil.rmtree(backend, ignore_errors=True)


def test_io_direct_is_used_on_a_disk(make_store, tmp_path):
    store = make_store([4096], store_pipeline="Posix", io_direct=True)
    assert store.direct_io() == [True] and store.notes() == []


def test_several_backends_spread_blocks(make_store, tmp_path):
    roots = [tmp_path / f"d{i}" for i in range(3)]
    store = make_store(SHARDS, store_pipeline="Posix", storage_backends=":".join(map(str, roots)))
    keys = [key(i, "multi") for i in range(90)]
    data = [block(k, SHARDS) for k in keys]
    assert store.wait(store.dump(keys, data)).all_ok
    counts = [sum(1 for f in r.rglob("*") if f.is_file()) for r in roots]
    assert sum(counts) == 90 and min(counts) >= 15  # hash % 3 spreads evenly
    for k in keys:  # each block lives in exactly one backend
        block_path(store, k)
    store.close()
    # The list form finds the same blocks.
    again = make_store(SHARDS, store_pipeline="Posix", storage_backends=[str(r) for r in roots])
    out = [empty(SHARDS) for _ in keys]
    assert again.wait(again.load(keys, out)).all_ok
    assert all(same(a, b) for a, b in zip(data, out, strict=True))
