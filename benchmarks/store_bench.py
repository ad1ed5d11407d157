"""Native store micro-benchmark: every figure next to a physical reference from the same run.

    python benchmarks/store_bench.py [--quick] [--dir DIR] [--only dram,posix,lookup]

- DRAM tier (pipeline "Cache") dump and load GB/s vs a native memcpy of the same shards.
- Posix tier write and cold read GB/s, with and without O_DIRECT, vs `dd` with direct I/O
  (bs = block size) on the same filesystem; interleaved repeats in rotating order, medians.
- lookup_prefix latency over 1,000 and 100,000 present keys vs os.stat of the same files.
- Every loaded block is compared with what was dumped: torn/corrupt blocks returned must be 0.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import ucm_store
from ucm_store import _native

KIB, MIB, GIB = 1 << 10, 1 << 20, 1 << 30
REPO = Path(__file__).resolve().parents[1]


def keys_for(ns: str, n: int) -> list[bytes]:
    return [hashlib.blake2b(f"{ns}:{i}".encode(), digest_size=16).digest() for i in range(n)]


def aligned(nbytes: int, fill: int | None = None) -> np.ndarray:
    """Page-aligned bytes, as a KV cache's are (numpy's own data sits 16 bytes into a page,
    which would make every copy to or from a page-aligned slot a misaligned one)."""
    raw = np.empty(nbytes + 4096, np.uint8)
    off = -raw.ctypes.data % 4096
    arr = raw[off : off + nbytes]
    if fill is None:
        arr[:] = np.random.default_rng(nbytes).integers(0, 256, nbytes, dtype=np.uint8)
    else:
        arr[:] = fill
    return arr


def layout(arena: np.ndarray, n: int, shard: int, shards: int) -> list[list[tuple[int, int]]]:
    base = arena.ctypes.data
    return [[(base + (b * shards + s) * shard, shard) for s in range(shards)] for b in range(n)]


def gbps(nbytes: int, seconds: float) -> float:
    return nbytes / seconds / 1e9


def row(
    name: str,
    value: float,
    ref_name: str,
    ref: float,
    target: float | None,
    spread: str = "",
    ratio: float | None = None,
) -> str:
    """One figure next to its reference; `ratio` defaults to value / ref."""
    ratio = value / ref if ratio is None else ratio
    verdict = "" if target is None else ("  PASS" if ratio >= target else f"  MISS (<{target}x)")
    return f"{name:<44} {value:7.2f} GB/s   {ref_name} {ref:7.2f} GB/s   {ratio:5.2f}x{verdict}{spread}"


def check_disk(path: Path) -> str:
    fstype = subprocess.run(
        ["stat", "-f", "-c", "%T", str(path)], capture_output=True, text=True
    ).stdout.strip()
    if fstype in ("tmpfs", "ramfs"):
        sys.exit(f"{path} is on {fstype}: pick a real disk with --dir")
    return fstype


def drop_cache(files: list[Path]) -> str:
    """Cold page cache: drop_caches where allowed, else posix_fadvise(DONTNEED) per file."""
    os.sync()
    try:
        Path("/proc/sys/vm/drop_caches").write_text("1")
        return "drop_caches"
    except OSError:
        for f in files:
            fd = os.open(f, os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)
        return "fadvise"


def verify(dst: np.ndarray, src: np.ndarray, n: int, block: int) -> int:
    """Blocks whose loaded bytes differ from the dumped ones."""
    d = dst[: n * block].reshape(n, block)
    s = src[: n * block].reshape(n, block)
    return int((d != s).any(axis=1).sum())


def dram_case(size: int, shards: int, total: int, repeats: int, corrupt: list[int]) -> list[str]:
    shard = size // shards
    block = shard * shards
    n = max(4, total // block)
    src = aligned(n * block)
    dst = aligned(n * block, fill=1)  # pages faulted in, as the cache's are
    src_l, dst_l = layout(src, n, shard, shards), layout(dst, n, shard, shards)
    ops = [
        (d[0], s[0], shard) for db, sb in zip(dst_l, src_l, strict=True) for d, s in zip(db, sb, strict=True)
    ]

    def ref() -> float:
        t = time.perf_counter()
        _native.memcpy_batch(ops)
        return time.perf_counter() - t

    cfg = {"store_pipeline": "Cache", "cache_buffer_capacity_gb": (n + 1) * block / GIB}
    store = ucm_store.Store.from_config(cfg, shard_sizes=[shard] * shards)
    rounds = iter(range(1 << 30))
    last_keys: list[bytes] = []

    def dump() -> float:
        keys = keys_for(f"dram{size}.{shards}.{next(rounds)}", n)  # fresh keys: no skips
        t = time.perf_counter()
        res = store.wait(store.dump(keys, src_l))
        el = time.perf_counter() - t
        assert res.all_ok, res
        last_keys[:] = keys
        return el

    def load() -> float:
        dst[:] = 0
        t = time.perf_counter()
        res = store.wait(store.load(last_keys, dst_l))
        el = time.perf_counter() - t
        assert res.all_ok, res
        corrupt[0] += verify(dst, src, n, block)
        return el

    # Interleaved, best of `repeats`: reference and store see the same machine conditions
    # (this VM's memory bandwidth drifts by +-20% from second to second).
    t_ref = t_dump = t_load = float("inf")
    for _ in range(repeats):
        t_ref = min(t_ref, ref())
        t_dump = min(t_dump, dump())
        t_load = min(t_load, load())
    store.close()
    nbytes = n * block
    label = f"{size // KIB} KiB x {shards} shards"
    target = 0.8 if size >= 2 * MIB else None
    mem = gbps(nbytes, t_ref)
    return [
        row(f"DRAM dump  {label}", gbps(nbytes, t_dump), "memcpy", mem, target),
        row(f"DRAM load  {label}", gbps(nbytes, t_load), "memcpy", mem, target),
    ]


def dd(args: list[str]) -> float:
    t = time.perf_counter()
    subprocess.run(["dd", *args], check=True, capture_output=True)
    return time.perf_counter() - t


def rotated(items: list, by: int) -> list:
    by %= len(items)
    return items[by:] + items[:by]


def pack_io(pool: ThreadPoolExecutor, store, op: str, keys: list[bytes], blocks: list, per_pack: int) -> None:
    """Writes or reads `keys` as packs of `per_pack` blocks on `pool`, threads that live as long
    as the store's own I/O threads do (each keeps its scratch buffer; the native call releases
    the GIL)."""
    spans = [(at, min(at + per_pack, len(keys))) for at in range(0, len(keys), per_pack)]

    def one(span: tuple[int, int]) -> None:
        b, e = span
        if op == "write":
            assert store.write_pack(keys[b:e], blocks[b:e]) == ("", e - b)
        else:
            assert store.read_pack(keys[b:e], 0, e - b, blocks[b:e]) == [""] * (e - b)

    list(pool.map(one, spans))


def bench_posix(
    root: Path, cases, total: int, repeats: int, corrupt: list[int], pack_bytes: int = 0, target: float = 0.8
) -> list[str]:
    """Posix tier vs dd, interleaved: each repeat writes the same bytes with dd and with the
    store (O_DIRECT and buffered), then reads each back from a cold page cache. The order of
    the three rotates from repeat to repeat, because this VM's virtual disk is faster or slower
    depending on what was just written (host-side write-back): the ratio shown is the median of
    the per-repeat ratios, and the GB/s the medians."""
    return [
        line
        for case in cases
        for line in posix_case(root, *case, total, repeats, corrupt, pack_bytes, target)
    ]


def posix_case(
    root: Path,
    size: int,
    shards: int,
    total: int,
    repeats: int,
    corrupt: list[int],
    pack_bytes: int = 0,
    target: float = 0.8,
) -> list[str]:
    modes = {"O_DIRECT": True, "buffered": False}
    per_pack = max(1, pack_bytes // size)
    pool = None
    if pack_bytes:  # the same O_DIRECT store, its blocks written and read as packs
        modes["packs"] = True
    ddfile = root / "dd.bin"
    shard = size // shards
    block = shard * shards
    n = max(8, total // block)
    nbytes = n * block
    src = aligned(nbytes)
    dst = aligned(nbytes, fill=0)
    src_l, dst_l = layout(src, n, shard, shards), layout(dst, n, shard, shards)
    times: dict[str, list[float]] = {}
    how = ""
    stores = {}
    for mode, direct in modes.items():
        backend = root / f"posix-{mode}"
        shutil.rmtree(backend, ignore_errors=True)
        # A store in service: its 4,096 shard directories exist (the first block of each makes
        # it, a one-time cost per backend that dd's single file does not have).
        for i in range(4096):
            (backend / f"{i:03x}").mkdir(parents=True, exist_ok=True)
        cfg = {"store_pipeline": "Posix", "storage_backends": str(backend), "io_direct": direct}
        store = ucm_store.Store.from_config(cfg, shard_sizes=[shard] * shards)
        assert store.direct_io() == [direct], store.notes()
        stores[mode] = (store, backend)
        if mode == "packs":
            pool = ThreadPoolExecutor(store.settings.io_threads)
            # The pool's threads grow their read buffers to a pack on their first pack (the
            # store's own I/O threads do so once in a server's life; their block-sized buffers
            # are faulted in when the store opens): one untimed pass, so that the repeats
            # measure what a server does after its first packs, as the store's rows do.
            warm = keys_for(f"warm{size}.{shards}", n)
            pack_io(pool, store, "write", warm, src_l, per_pack)
            pack_io(pool, store, "read", warm, dst_l, per_pack)
    for rep in range(repeats):
        keys = keys_for(f"posix{size}.{shards}.{rep}", n)  # new blocks every repeat
        order = ["dd", *modes]
        order = rotated(order, rep)
        for op in ("write", "read"):
            for who in order:
                if op == "read":
                    files = [ddfile] if who == "dd" else [p for p in stores[who][1].rglob("*") if p.is_file()]
                    how = drop_cache(files)
                    dst[:] = 0
                t = time.perf_counter()
                if who == "dd" and op == "write":
                    dd(["if=/dev/zero", f"of={ddfile}", f"bs={size}", f"count={n}", "oflag=direct"])
                elif who == "dd":
                    dd([f"if={ddfile}", "of=/dev/null", f"bs={size}", "iflag=direct"])
                elif who == "packs":
                    assert pool is not None
                    pack_io(pool, stores[who][0], op, keys, src_l if op == "write" else dst_l, per_pack)
                else:
                    store = stores[who][0]
                    res = store.wait(store.dump(keys, src_l) if op == "write" else store.load(keys, dst_l))
                    assert res.all_ok, res
                times.setdefault(f"{who} {op}", []).append(time.perf_counter() - t)
                if who != "dd" and op == "read":
                    corrupt[0] += verify(dst, src, n, block)
        ddfile.unlink()
    if pool is not None:
        pool.shutdown()
    for store, backend in stores.values():
        store.close()
        shutil.rmtree(backend)
    lines = []
    label = f"{size // KIB} KiB x {shards} shards"
    for mode, direct in modes.items():
        for op in ("write", "read"):
            what = f"O_DIRECT, packs of {per_pack}" if mode == "packs" else mode
            name = f"Posix {op:<5} {what:<8} {label}" + (f" ({how})" if op == "read" else "")
            ours, ref = times[f"{mode} {op}"], times[f"dd {op}"]
            pairs = [r / o for r, o in zip(ref, ours, strict=True)]
            lines.append(
                row(
                    name,
                    gbps(nbytes, statistics.median(ours)),
                    "dd direct",
                    gbps(nbytes, statistics.median(ref)),
                    target if direct else None,
                    f"   (per repeat {min(pairs):.2f}-{max(pairs):.2f}x)",
                    statistics.median(pairs),
                )
            )
    return lines


def bench_lookup(root: Path, counts: list[int]) -> list[str]:
    lines = []
    backend = root / "lookup"
    shutil.rmtree(backend, ignore_errors=True)
    n = max(counts)
    keys = keys_for("lookup", n)
    cfg = {"store_pipeline": "Posix", "storage_backends": str(backend)}
    store = ucm_store.Store.from_config(cfg, shard_sizes=[512])
    payload = np.zeros(512, np.uint8)
    for at in range(0, n, 10000):
        part = keys[at : at + 10000]
        assert store.wait(store.dump(part, [[payload]] * len(part))).all_ok
    for count in counts:
        probe = keys[:count]
        paths = [str(backend / k.hex()[:3] / k.hex()) for k in probe]
        runs = 20 if count <= 1000 else 3
        times, refs = [], []
        for _ in range(runs):
            t = time.perf_counter()
            got = store.lookup_prefix(probe)
            times.append(time.perf_counter() - t)
            assert got == count, got
            t = time.perf_counter()
            for p in paths:
                os.stat(p)
            refs.append(time.perf_counter() - t)
        ms, ref = statistics.median(times) * 1e3, statistics.median(refs) * 1e3
        verdict = ""
        if count == 1000:
            verdict = "  PASS (< 20 ms)" if ms < 20 else "  MISS (>= 20 ms)"
        lines.append(
            f"lookup_prefix {count:>7} present keys (Posix)   {ms:8.2f} ms   "
            f"os.stat loop {ref:8.2f} ms   {ms / ref:5.2f}x{verdict}"
        )
    store.close()
    cache_cfg = {**cfg, "store_pipeline": "Cache|Posix", "cache_buffer_capacity_gb": 0.1}
    store = ucm_store.Store.from_config(cache_cfg, shard_sizes=[512])
    part = keys[:1000]
    assert store.wait(store.load(part, [[np.zeros(512, np.uint8)] for _ in part])).all_ok
    t = time.perf_counter()
    assert store.lookup_prefix(part) == 1000
    lines.append(f"lookup_prefix    1000 present keys (in cache)  {(time.perf_counter() - t) * 1e3:8.2f} ms")
    store.close()
    shutil.rmtree(backend)
    return lines


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer sizes and bytes (~1 minute)")
    ap.add_argument(
        "--dir",
        type=Path,
        default=REPO / "build" / "store-bench",
        help="scratch directory on a real disk (not tmpfs)",
    )
    ap.add_argument(
        "--only",
        default="dram,posix,lookup",
        help="comma-separated sections to run (dram, posix, lookup); all by default",
    )
    ap.add_argument(
        "--pack-mib",
        type=int,
        default=0,
        help="also write and read the Posix blocks as packs of about this many MiB (0: no)",
    )
    ap.add_argument(
        "--repeats",
        type=int,
        default=0,
        help="Posix repeats per shape (default 3 with --quick, else 6); the ratio is their median",
    )
    ap.add_argument(
        "--target",
        type=float,
        default=0.8,
        help="the O_DIRECT Posix rows pass at this ratio to dd (0.8; issue #25's network mount: 0.9)",
    )
    args = ap.parse_args()
    only = set(args.only.split(","))
    if not only <= {"dram", "posix", "lookup"}:
        ap.error(f"--only: unknown section(s) {sorted(only - {'dram', 'posix', 'lookup'})}")
    root = args.dir
    root.mkdir(parents=True, exist_ok=True)
    fstype = check_disk(root)
    quick = args.quick
    print(
        f"store_bench: dir {root} ({fstype}), {os.cpu_count()} CPUs, "
        f"crc32c hardware={_native.CRC32C_HARDWARE}, quick={quick}"
    )
    corrupt = [0]
    dram_sizes = [256 * KIB, 2 * MIB, 16 * MIB] if quick else [256 * KIB, 2 * MIB, 4 * MIB, 16 * MIB]
    for size in dram_sizes if "dram" in only else []:
        for shards in (4, 80):
            for line in dram_case(size, shards, 256 * MIB, 5 if quick else 9, corrupt):
                print(line, flush=True)
    posix_cases = [(256 * KIB, 4), (4 * MIB, 80), (16 * MIB, 4)]
    if not quick:
        posix_cases = [
            (256 * KIB, 4),
            (2 * MIB, 4),
            (4 * MIB, 4),
            (4 * MIB, 80),
            (16 * MIB, 4),
            (16 * MIB, 80),
        ]
    if "posix" in only:
        total, repeats = (512 * MIB, 3) if quick else (1024 * MIB, 6)
        repeats = args.repeats or repeats
        for line in bench_posix(root, posix_cases, total, repeats, corrupt, args.pack_mib * MIB, args.target):
            print(line, flush=True)
    if "lookup" in only:
        for line in bench_lookup(root, [1000, 20000 if quick else 100000]):
            print(line, flush=True)
    print(f"torn/corrupt blocks returned: {corrupt[0]}")
    return 1 if corrupt[0] else 0


if __name__ == "__main__":
    sys.exit(main())
