"""Where a block's time goes on a FUSE-mounted network filesystem: the store's file calls, one at a
time, against `dd` streaming the same bytes into one file on the same mount.

    sudo python benchmarks/netfs_file_ops.py [--blocks 100] [--mib 1]

Three network-namespace test hosts, a GlusterFS volume served from h3 and FUSE-mounted on h1 with
the coherent client options (tests/support/gluster.py). On h1, for each block the calls the store
makes (posix_tier.cpp): write = stat the final name, create a temp file O_DIRECT, one pwritev,
close, rename over the final name; read = open O_DIRECT, fstat, one pread, close. Prints the mean
milliseconds of each call and, as the reference measured in the same run, dd's milliseconds per
block-sized piece of one streamed file (oflag/iflag=direct). It explains why the store's O_DIRECT
write and read on the mount fall short of dd for small blocks (benchmarks/RESULTS.md).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.support import gluster
from tests.support.netns import cluster_or_skip

# Runs on h1, in its mount namespace: argv = folder, blocks, bytes per block; prints one JSON line.
ON_HOST = r"""
import collections, json, mmap, os, subprocess, sys, time
folder, n, size = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
os.makedirs(folder, exist_ok=True)
buf = mmap.mmap(-1, size)  # page-aligned, as O_DIRECT wants
buf.write(os.urandom(size))
took = collections.defaultdict(float)
def timed(name, call, *args):
    t = time.perf_counter()
    try:
        return call(*args)
    finally:
        took[name] += time.perf_counter() - t
for i in range(n):
    final = f"{folder}/b{i}"
    try:
        timed("write: stat", os.stat, final)
    except FileNotFoundError:
        pass
    flags = os.O_CREAT | os.O_EXCL | os.O_WRONLY | os.O_DIRECT
    fd = timed("write: create", os.open, final + ".tmp", flags, 0o644)
    timed("write: pwritev", os.pwritev, fd, [buf], 0)
    timed("write: close", os.close, fd)
    timed("write: rename", os.rename, final + ".tmp", final)
for i in range(n):
    fd = timed("read: open", os.open, f"{folder}/b{i}", os.O_RDONLY | os.O_DIRECT)
    timed("read: fstat", os.fstat, fd)
    timed("read: pread", os.preadv, fd, [buf], 0)
    timed("read: close", os.close, fd)
dd = f"{folder}/dd.bin"
t = time.perf_counter()
subprocess.run(["dd", "if=/dev/zero", f"of={dd}", f"bs={size}", f"count={n}", "oflag=direct"],
               check=True, capture_output=True)
took["dd write"] = time.perf_counter() - t
t = time.perf_counter()
subprocess.run(["dd", f"if={dd}", "of=/dev/null", f"bs={size}", "iflag=direct"],
               check=True, capture_output=True)
took["dd read"] = time.perf_counter() - t
print(json.dumps({k: v * 1e3 / n for k, v in took.items()}))
"""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--blocks", type=int, default=100)
    ap.add_argument("--mib", type=int, default=1, help="block size, MiB")
    args = ap.parse_args()
    if reason := gluster.available():
        print(f"cannot run: {reason}", file=sys.stderr)
        return 2
    size = args.mib << 20
    with (
        cluster_or_skip(3) as hosts,
        gluster.gluster_volume(hosts, "ops", server="h3", clients=["h1"]) as vol,
    ):
        argv = [sys.executable, "-c", ON_HOST, str(vol.mount / "ops"), str(args.blocks), str(size)]
        done = vol.on("h1", *argv, timeout=1800)
        if done.returncode:
            print(done.stderr[-3000:], file=sys.stderr)
            return 1
    ms = json.loads(done.stdout.splitlines()[-1])
    print(f"{args.blocks} blocks of {args.mib} MiB on the GlusterFS mount, mean ms per call:")
    for op in ("write", "read"):
        calls = {k: v for k, v in ms.items() if k.startswith(f"{op}:")}
        print("  " + ", ".join(f"{k.split(': ')[1]} {v:.2f}" for k, v in calls.items()))
        ours, ref = sum(calls.values()), ms[f"dd {op}"]
        print(
            f"  {op} total {ours:.2f} ms per block, dd {ref:.2f} ms per {args.mib} MiB: {ref / ours:.2f}x dd"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
