"""Packs: consecutive blocks of one chain in one file named by the first block's key.

What a pack must keep: a reader whose chain shares only the pack's first blocks finds those
and no more; a second writer of the same first block never replaces the first's pack (what
the first reported held stays held); every block read is checked against its key and CRC;
damage moves the pack aside; the collector counts and reclaims packs like blocks.
"""

from __future__ import annotations

import os
import socket
import subprocess
import threading
from pathlib import Path

import numpy as np
import pytest
from ucm_store import _native

from tests.support.blocks import block, empty, key, same
from tests.support.processes import wait_for
from ucmctl.core.pack_heads import pack_refs

SHARDS = [4096, 8192]  # whole pages: written straight from the caller's memory
ODD = [1000, 3000]  # not pages: staged (O_DIRECT) or padded (buffered)


def chain(n: int, ns: str = "c") -> list[bytes]:
    return [key(i, ns) for i in range(n)]


def forked(base: list[bytes], at: int, ns: str) -> list[bytes]:
    """The same chain up to `at`, another after it (one system prompt, two questions)."""
    return base[:at] + [key(i, ns) for i in range(at, len(base))]


def dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def race(writers: dict, act) -> dict:  # type: ignore[type-arg]
    """Each writer (name: (store, keys)) calls act(store, keys, blocks) on its own thread, all
    released at once; their results by name."""
    got = {}
    go = threading.Barrier(len(writers))

    def run(name: str, store, keys: list[bytes]) -> None:
        data = [block(k, SHARDS) for k in keys]
        go.wait()
        got[name] = act(store, keys, data)

    threads = [threading.Thread(target=run, args=(name, *w)) for name, w in writers.items()]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return got


def pack_files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*.pack") if p.parent.name != "corrupt")


@pytest.mark.parametrize("shards", [SHARDS, ODD], ids=["pages", "odd"])
@pytest.mark.parametrize("io_direct", [False, True])
def test_a_pack_round_trips_and_reads_any_range(make_store, tmp_path, shards, io_direct):
    store = make_store(shards, store_pipeline="Posix", io_direct=io_direct)
    keys = chain(8)
    assert store.write_pack(keys, [block(k, shards) for k in keys]) == ("", 8)
    (only,) = pack_files(tmp_path / "b0")
    assert only.name == keys[0].hex() + ".pack"
    assert not list((tmp_path / "b0").rglob(keys[1].hex()))  # no file per block
    stats = store.stats()
    assert stats["posix_packs_written"] == 1 and stats["posix_blocks_written"] == 8
    assert store.pack_prefix(keys) == 8
    for begin, end in [(0, 8), (3, 6), (7, 8), (5, 5)]:
        targets = [empty(shards, fill=0xAB) for _ in range(begin, end)]
        assert store.read_pack(keys, begin, end, targets) == [""] * (end - begin)
        assert all(same(t, block(k, shards)) for t, k in zip(targets, keys[begin:end], strict=True))


def test_a_chain_that_forks_inside_a_pack_finds_the_shared_blocks_only(make_store):
    store = make_store(SHARDS, store_pipeline="Posix")
    first = chain(8)
    assert store.write_pack(first, [block(k, SHARDS) for k in first]) == ("", 8)
    other = forked(first, 5, "other")
    assert store.pack_prefix(other) == 5
    assert store.pack_prefix(first[:3]) == 3  # a shorter chain: all of it
    targets = [empty(SHARDS, fill=7) for _ in range(8)]
    reasons = store.read_pack(other, 0, 8, targets)
    assert reasons == [""] * 5 + ["not found"] * 3
    assert all(same(targets[i], block(other[i], SHARDS)) for i in range(5))
    assert all(same(t, empty(SHARDS, fill=7)) for t in targets[5:])  # never another chain's bytes
    assert store.pack_prefix(chain(8, "unrelated")) == 0


def test_a_second_writer_of_the_same_first_block_never_replaces_the_pack(make_store, tmp_path):
    store = make_store(SHARDS, store_pipeline="Posix")
    first = chain(8)
    assert store.write_pack(first, [block(k, SHARDS) for k in first]) == ("", 8)
    before = pack_files(tmp_path / "b0")[0].stat()
    other = forked(first, 5, "other")
    # It holds the shared 5; the 3 after the fork are the caller's to store some other way.
    assert store.write_pack(other, [block(k, SHARDS) for k in other]) == ("", 5)
    assert store.write_pack(first, [block(k, SHARDS) for k in first]) == ("", 8)
    after = pack_files(tmp_path / "b0")[0].stat()
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)
    assert store.stats()["posix_write_skipped"] == 13
    targets = [empty(SHARDS) for _ in range(8)]
    assert store.read_pack(first, 0, 8, targets) == [""] * 8
    assert all(same(t, block(k, SHARDS)) for t, k in zip(targets, first, strict=True))
    assert not list((tmp_path / "b0").rglob("*.tmp.*"))


def test_two_writers_at_once_one_pack_remains_and_each_is_told_what_it_holds(make_store, tmp_path):
    """Eight rounds of two stores racing to write packs of one first block, different tails:
    exactly one pack each time, and the loser's `held` is what the winner's pack holds of it."""
    a, b = make_store(SHARDS, store_pipeline="Posix"), make_store(SHARDS, store_pipeline="Posix")
    for round_ in range(8):
        left = chain(6, f"r{round_}")
        right = forked(left, 2, f"r{round_}-right")
        got = race(
            {"left": (a, left), "right": (b, right)},
            lambda store, keys, data: store.write_pack(keys, data),
        )
        assert sorted(got.values()) == [("", 2), ("", 6)], got
        winner = left if got["left"] == ("", 6) else right
        targets = [empty(SHARDS) for _ in range(6)]
        assert a.read_pack(winner, 0, 6, targets) == [""] * 6
        assert all(same(t, block(k, SHARDS)) for t, k in zip(targets, winner, strict=True))
    assert len(pack_files(tmp_path / "b0")) == 8
    assert not list((tmp_path / "b0").rglob("*.tmp.*"))


@pytest.mark.parametrize(
    ("damage", "reason"),
    [
        ("flip_payload", "payload checksum mismatch in block 2"),
        ("flip_header", "header checksum mismatch"),
        ("truncate", "truncated"),
        ("append", "oversized"),
    ],
)
def test_a_damaged_pack_is_a_failed_load_and_moved_aside(make_store, tmp_path, damage, reason):
    store = make_store(SHARDS, store_pipeline="Posix")
    keys = chain(4)
    store.write_pack(keys, [block(k, SHARDS) for k in keys])
    (path,) = pack_files(tmp_path / "b0")
    raw = bytearray(path.read_bytes())
    header = len(raw) - 4 * sum(SHARDS)
    if damage == "flip_payload":
        raw[header + 2 * sum(SHARDS) + 100] ^= 0xFF
    elif damage == "flip_header":
        raw[64 + 8 * len(SHARDS) + 3] ^= 0x01  # a byte of the first entry's key
    elif damage == "truncate":
        raw = raw[:-4096]
    else:
        raw += b"\0" * 4096
    path.write_bytes(bytes(raw))
    targets = [empty(SHARDS, fill=9) for _ in range(4)]
    reasons = store.read_pack(keys, 0, 4, targets)
    assert any(reason in r for r in reasons), reasons
    if damage == "flip_payload":  # the sound blocks of the pack were still delivered
        assert reasons[:2] == ["", ""] and reasons[3] == ""
        assert same(targets[2], empty(SHARDS, fill=9))
    else:
        assert all(r.startswith("corrupt block, pack moved aside") for r in reasons)
        assert all(same(t, empty(SHARDS, fill=9)) for t in targets)
    assert pack_files(tmp_path / "b0") == []
    assert len(list((tmp_path / "b0" / "corrupt").iterdir())) == 1
    assert store.stats()["quarantined_blocks"] == 1
    # The next writer stores the pack again.
    assert store.write_pack(keys, [block(k, SHARDS) for k in keys]) == ("", 4)
    assert store.pack_prefix(keys) == 4


def test_a_pack_of_another_shard_layout_is_an_error_left_in_place(make_store, tmp_path):
    keys = chain(3)
    make_store(SHARDS, store_pipeline="Posix").write_pack(keys, [block(k, SHARDS) for k in keys])
    other = make_store([4096, 4096], store_pipeline="Posix")
    reasons = other.read_pack(keys, 0, 3, [empty([4096, 4096]) for _ in range(3)])
    assert all("shard layout mismatch" in r for r in reasons)
    assert other.pack_prefix(keys) == 0
    err, held = other.write_pack(keys, [block(k, [4096, 4096]) for k in keys])
    assert "shard layout mismatch" in err and held == 0
    assert len(pack_files(tmp_path / "b0")) == 1


def test_the_collector_counts_packs_and_reclaims_a_dead_writers_pack_temp(make_store, tmp_path):
    pack_size = 4096 + 4 * sum(SHARDS)  # header page + 4 blocks
    # Written without a limit (no pass can run before the ages are set), then collected by a
    # store that has one (its own first pass may do the work: judge the outcome).
    writer = make_store(SHARDS, store_pipeline="Posix")
    packs = [chain(4, f"p{i}") for i in range(8)]
    for i, keys in enumerate(packs):
        assert writer.write_pack(keys, [block(k, SHARDS) for k in keys]) == ("", 4)
        path = tmp_path / "b0" / keys[0].hex()[:3] / (keys[0].hex() + ".pack")
        assert path.stat().st_size == pack_size
        os.utime(path, (1000 + i, 1000 + i))  # oldest first
    first = packs[0][0].hex()
    # a writer of this host whose pid is gone, and one of another host, fresh: only the first goes
    dead = tmp_path / "b0" / first[:3] / f"{first}.pack.tmp.{socket.gethostname()}.{dead_pid()}.0"
    remote = tmp_path / "b0" / first[:3] / f"{first}.pack.tmp.other.node.example.123.0"
    for p in (dead, remote):
        p.write_bytes(b"x" * 4096)
    store = make_store(SHARDS, store_pipeline="Posix", posix_capacity_gb=6 * pack_size / 2**30)
    report = store.collect_garbage()
    assert not dead.exists() and remote.exists()
    assert store.stats()["temps_reclaimed"] == 1
    assert report["blocks"] == 5  # 8 packs, each one entry, down to 90% of 6
    assert report["used_bytes"] == 5 * pack_size
    left = {p.name for p in pack_files(tmp_path / "b0")}
    assert left == {keys[0].hex() + ".pack" for keys in packs[3:]}  # the oldest went first


def test_packs_and_single_blocks_live_side_by_side(make_store):
    store = make_store(SHARDS, store_pipeline="Posix")
    keys = chain(4)
    store.write_pack(keys, [block(k, SHARDS) for k in keys])
    # A block file of the pack's first key is another thing: the block API does not see packs.
    assert store.lookup_prefix(keys) == 0
    assert store.wait(store.dump(keys[:1], [block(keys[0], SHARDS)]), timeout=10).all_ok
    assert store.lookup_prefix(keys) == 1 and store.pack_prefix(keys) == 4
    target = empty(SHARDS)
    assert store.wait(store.load(keys[:1], [target]), timeout=10).all_ok
    assert same(target, block(keys[0], SHARDS))


def test_bad_arguments_are_refused(make_store):
    store = make_store(SHARDS, store_pipeline="Posix")
    with pytest.raises(ValueError, match="1 to 4096 blocks"):
        store.write_pack([], [])
    keys = chain(2)
    with pytest.raises(ValueError, match="within the keys"):
        store.read_pack(keys, 1, 3, [empty(SHARDS)] * 2)
    with pytest.raises(ValueError, match="shards"):
        store.write_pack(keys, [[np.zeros(4096, np.uint8)]] * 2)
    cache_only = make_store(SHARDS, store_pipeline="Cache")
    with pytest.raises(ValueError, match="Posix tier"):
        cache_only.pack_prefix(keys)


# ---- packs in the dump and load tasks -------------------------------------------------------

PIPELINES = ["Posix", "Cache|Posix"]


def refs(chain_keys: list[bytes], start: int, count: int, per_pack: int):
    """Blocks start .. start + count - 1 of a chain where no other chain's pack is on disk."""
    return pack_refs(chain_keys, range(start, start + count), per_pack, ())


def single_files(root: Path) -> list[Path]:
    return [p for p in root.rglob("*") if p.is_file() and len(p.name) == 32]


@pytest.mark.parametrize("pipeline", PIPELINES)
def test_a_dump_in_packs_is_read_back_by_another_store_in_one_read_per_pack(make_store, tmp_path, pipeline):
    keys = chain(8)
    writer = make_store(SHARDS, store_pipeline=pipeline)
    res = writer.wait_persisted(
        writer.dump(keys, [block(k, SHARDS) for k in keys], packs=refs(keys, 0, 8, 4)), 10
    )
    assert res.all_ok, res
    assert [p.name for p in pack_files(tmp_path / "b0")] == sorted(
        k.hex() + ".pack" for k in (keys[0], keys[4])
    )
    assert single_files(tmp_path / "b0") == []
    assert writer.stats()["posix_packs_written"] == 2
    reader = make_store(SHARDS, store_pipeline=pipeline)  # a cold cache: every block from the packs
    packs = refs(keys, 0, 8, 4)
    assert reader.lookup_prefix(keys) == 0  # the block files: none
    assert reader.lookup_prefix(keys, packs=packs) == 8
    assert reader.lookup(keys, packs=packs) == [True] * 8
    targets = [empty(SHARDS, fill=3) for _ in keys]
    assert reader.wait(reader.load(keys, targets, packs=packs), 10).all_ok
    assert all(same(t, block(k, SHARDS)) for t, k in zip(targets, keys, strict=True))
    stats = reader.stats()
    assert stats["posix_packs_read"] == 2 and stats["posix_hits"] == 8
    # a part of a pack: blocks 5..6 only
    part = [empty(SHARDS) for _ in range(2)]
    assert reader.wait(reader.load(keys[5:7], part, packs=refs(keys, 5, 2, 4)), 10).all_ok
    assert all(same(t, block(k, SHARDS)) for t, k in zip(part, keys[5:7], strict=True))


@pytest.mark.parametrize("pipeline", PIPELINES)
def test_blocks_past_a_gap_or_not_from_a_packs_start_are_files_of_their_own(make_store, tmp_path, pipeline):
    keys = chain(8)
    store = make_store(SHARDS, store_pipeline=pipeline)
    # a step saves blocks 0..5 (one whole pack, and the first two of the next), a later step 6..7
    first = store.dump(keys[:6], [block(k, SHARDS) for k in keys[:6]], packs=refs(keys, 0, 6, 4))
    assert store.wait_persisted(first, 10).all_ok
    later = store.dump(keys[6:], [block(k, SHARDS) for k in keys[6:]], packs=refs(keys, 6, 2, 4))
    assert store.wait_persisted(later, 10).all_ok
    assert len(pack_files(tmp_path / "b0")) == 2  # [0..3] and [4, 5]
    assert {p.name for p in single_files(tmp_path / "b0")} == {keys[6].hex(), keys[7].hex()}
    # a gap: indices 0, 1, 3 of another chain: a pack of two, block 3 a file
    other = chain(4, "gap")
    picked = [0, 1, 3]
    gap = store.dump(
        [other[i] for i in picked],
        [block(other[i], SHARDS) for i in picked],
        packs=[(other[0], i) for i in picked],
    )
    assert store.wait_persisted(gap, 10).all_ok
    assert (tmp_path / "b0" / other[0].hex()[:3] / f"{other[0].hex()}.pack").exists()
    assert (tmp_path / "b0" / other[3].hex()[:3] / other[3].hex()).exists()
    reader = make_store(SHARDS, store_pipeline=pipeline)
    packs = refs(keys, 0, 8, 4)
    assert reader.lookup_prefix(keys, packs=packs) == 8
    targets = [empty(SHARDS) for _ in keys]
    assert reader.wait(reader.load(keys, targets, packs=packs), 10).all_ok
    assert all(same(t, block(k, SHARDS)) for t, k in zip(targets, keys, strict=True))


@pytest.mark.parametrize("pipeline", PIPELINES)
def test_a_chain_forking_inside_anothers_pack_stores_its_own_blocks_beside_it(make_store, tmp_path, pipeline):
    first = chain(8)
    store = make_store(SHARDS, store_pipeline=pipeline)
    assert store.wait_persisted(
        store.dump(first, [block(k, SHARDS) for k in first], packs=refs(first, 0, 8, 8)), 10
    ).all_ok
    other = forked(first, 5, "other")
    packs = refs(other, 0, 8, 8)
    reader = make_store(SHARDS, store_pipeline=pipeline)
    assert reader.lookup_prefix(other, packs=packs) == 5
    # Its dump finds the first chain's pack: the 5 shared blocks held there, its 3 as files.
    res = reader.wait_persisted(reader.dump(other, [block(k, SHARDS) for k in other], packs=packs), 10)
    assert res.all_ok, res
    assert len(pack_files(tmp_path / "b0")) == 1
    assert {p.name for p in single_files(tmp_path / "b0")} == {k.hex() for k in other[5:]}
    fresh = make_store(SHARDS, store_pipeline=pipeline)
    for keys in (first, other):
        assert fresh.lookup_prefix(keys, packs=refs(keys, 0, 8, 8)) == 8
        targets = [empty(SHARDS) for _ in keys]
        assert fresh.wait(fresh.load(keys, targets, packs=refs(keys, 0, 8, 8)), 10).all_ok
        assert all(same(t, block(k, SHARDS)) for t, k in zip(targets, keys, strict=True))


def head_refs(keys: list[bytes], heads: list[int]) -> list[tuple[bytes, int]] | None:
    """As the connector makes them from a lookup's heads (packs of 4)."""
    return pack_refs(keys, range(len(heads)), 4, heads)


@pytest.mark.parametrize("pipeline", PIPELINES)
def test_chains_forking_inside_packs_keep_their_tails_in_packs_that_pack_heads_finds(
    make_store, tmp_path, pipeline
):
    """Packs of 4. A chain forking inside another's pack stores its blocks of that pack's range
    in a tail pack named by the first of them; one forking inside that tail continues the same
    way; pack_heads says where every block of every chain is, and each reads back whole."""
    a = chain(8, "a")
    b = forked(a, 2, "b")  # forks inside a's first pack
    c = forked(b, 3, "c")  # inside b's tail
    d = forked(b, 5, "d")  # inside b's second pack
    store = make_store(SHARDS, store_pipeline=pipeline)
    assert store.pack_heads(a, 4) == [0, 0, 0, 0, 4, 4, 4, 4]  # nothing on disk: the ranges
    assert store.pack_heads(a[:6], 4, timeout=5) == [0, 0, 0, 0, 4, 4]

    def stored(keys: list[bytes], heads: list[int], expect: list[int]) -> None:
        assert heads == expect, heads
        refs_ = head_refs(keys, heads)
        todo = [p for p, held in enumerate(store.lookup(keys, packs=refs_)) if not held]
        res = store.wait_persisted(
            store.dump([keys[p] for p in todo], [block(keys[p], SHARDS) for p in todo],
                       packs=[refs_[p] for p in todo]), 10)  # fmt: skip
        assert res.all_ok, res

    stored(a, store.pack_heads(a, 4), [0, 0, 0, 0, 4, 4, 4, 4])
    stored(b, store.pack_heads(b, 4), [0, 0, 2, 2, 4, 4, 4, 4])
    stored(c, store.pack_heads(c, 4), [0, 0, 2, 3, 4, 4, 4, 4])
    stored(d, store.pack_heads(d, 4), [0, 0, 2, 2, 4, 5, 5, 5])
    assert {p.name for p in pack_files(tmp_path / "b0")} == {
        f"{k.hex()}.pack" for k in (a[0], a[4], b[2], b[4], c[4], d[5])
    }
    assert {p.name for p in single_files(tmp_path / "b0")} == {c[3].hex()}  # a tail of one block
    fresh = make_store(SHARDS, store_pipeline="Posix")
    for keys in (a, b, c, d):
        packs = head_refs(keys, fresh.pack_heads(keys, 4))
        assert fresh.lookup_prefix(keys, packs=packs) == 8
        targets = [empty(SHARDS) for _ in keys]
        assert fresh.wait(fresh.load(keys, targets, packs=packs), 10).all_ok
        assert all(same(t, block(k, SHARDS)) for t, k in zip(targets, keys, strict=True))
    assert fresh.stats()["posix_packs_read"] == 2 + 3 + 3 + 4  # c's block 3 from its own file


def test_a_dump_in_packs_through_a_full_cache_is_still_stored_whole(make_store, tmp_path):
    keys = chain(16)
    slot = sum(SHARDS) / 2**30
    store = make_store(SHARDS, store_pipeline="Cache|Posix", cache_buffer_capacity_gb=2 * slot)
    res = store.wait_persisted(
        store.dump(keys, [block(k, SHARDS) for k in keys], packs=refs(keys, 0, 16, 8)), 10
    )
    assert res.all_ok, res
    assert store.stats()["cache_full"] > 0  # some went around the cache, from a copy
    assert len(pack_files(tmp_path / "b0")) == 2
    reader = make_store(SHARDS, store_pipeline="Posix")
    targets = [empty(SHARDS) for _ in keys]
    assert reader.wait(reader.load(keys, targets, packs=refs(keys, 0, 16, 8)), 10).all_ok
    assert all(same(t, block(k, SHARDS)) for t, k in zip(targets, keys, strict=True))


@pytest.mark.parametrize("pipeline", PIPELINES)
def test_a_pack_read_that_returns_after_cancel_leaves_the_reused_buffers_alone(make_store, pipeline):
    keys = chain(4, "late")
    writer = make_store(SHARDS, store_pipeline="Posix")
    assert writer.wait_persisted(
        writer.dump(keys, [block(k, SHARDS) for k in keys], packs=refs(keys, 0, 4, 4)), 10
    ).all_ok
    reader = make_store(SHARDS, store_pipeline=pipeline)
    _native._inject_stall("posix_read", 1, 1500)
    try:
        targets = [empty(SHARDS) for _ in keys]
        tid = reader.load(keys, targets, packs=refs(keys, 0, 4, 4))
        with pytest.raises(TimeoutError):
            reader.wait(tid, timeout=0.2)
        res = reader.cancel(tid, "load timed out")
        assert res.ok == [False] * 4
        for t in targets:  # vLLM hands the blocks to another request
            for shard in t:
                shard[:] = 0x5A
        assert wait_for(lambda: reader.stats()["load_late"] == 4), reader.stats()  # the read returned
        assert all(same(t, empty(SHARDS, fill=0x5A)) for t in targets)
        assert reader.stats()["load_late"] == 4
    finally:
        _native._inject_stall("posix_read", 0, 0)


def test_bad_pack_references_are_refused(make_store):
    store = make_store(SHARDS, store_pipeline="Posix")
    keys = chain(2)
    with pytest.raises(ValueError, match="2 keys but 1 pack references"):
        store.lookup_prefix(keys, packs=[None])
    with pytest.raises(ValueError, match="16-byte first key"):
        store.dump(keys, [block(k, SHARDS) for k in keys], packs=[(b"short", 0), None])
    with pytest.raises(ValueError, match=r"out of 0\.\.4095"):
        store.load(keys, [empty(SHARDS)] * 2, packs=[(keys[0], 5000), None])
    assert pack_refs(keys, range(2), 1, ()) is None  # blocks of one per pack: no references


@pytest.mark.parametrize("pipeline", PIPELINES)
def test_two_stores_dumping_packs_of_one_head_at_once_both_persist_every_block(
    make_store, tmp_path, pipeline
):
    a, b = make_store(SHARDS, store_pipeline=pipeline), make_store(SHARDS, store_pipeline=pipeline)
    for round_ in range(6):
        left = chain(8, f"d{round_}")
        right = forked(left, 3, f"d{round_}-right")
        tids = race(
            {"left": (a, left), "right": (b, right)},
            lambda store, keys, data: (store, store.dump(keys, data, packs=refs(keys, 0, 8, 8))),
        )
        for store, tid in tids.values():
            res = store.wait_persisted(tid, 10)
            assert res.all_ok, res
        fresh = make_store(SHARDS, store_pipeline="Posix")
        for keys in (left, right):  # whichever pack won, each chain reads back whole
            packs = refs(keys, 0, 8, 8)
            assert fresh.lookup_prefix(keys, packs=packs) == 8
            targets = [empty(SHARDS) for _ in keys]
            assert fresh.wait(fresh.load(keys, targets, packs=packs), 10).all_ok
            assert all(same(t, block(k, SHARDS)) for t, k in zip(targets, keys, strict=True))
    assert len(pack_files(tmp_path / "b0")) == 6
    assert not list((tmp_path / "b0").rglob("*.tmp.*"))


@pytest.mark.parametrize("pipeline", PIPELINES)
def test_a_pack_that_cannot_be_written_fails_its_blocks_with_the_reason(make_store, tmp_path, pipeline):
    store = make_store(SHARDS, store_pipeline=pipeline)
    keys = chain(4, "unwritable")
    (tmp_path / "b0" / keys[0].hex()[:3]).write_text("not a directory")  # ENOTDIR on create
    res = store.wait_persisted(
        store.dump(keys, [block(k, SHARDS) for k in keys], packs=refs(keys, 0, 4, 4)), 10
    )
    assert res.ok == [False] * 4
    assert all("Not a directory" in e for e in res.errors)
    assert store.stats()["posix_write_errors"] == 4
    other = chain(4, "fine")  # the store goes on
    if other[0].hex()[:3] != keys[0].hex()[:3]:
        res = store.wait_persisted(
            store.dump(other, [block(k, SHARDS) for k in other], packs=refs(other, 0, 4, 4)), 10
        )
        assert res.all_ok, res
