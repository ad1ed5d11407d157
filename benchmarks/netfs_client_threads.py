"""Does the GlusterFS FUSE client's threading close the store's small-block gap to `dd`?

    sudo python benchmarks/netfs_client_threads.py [--mib 256]

Three network-namespace test hosts, a GlusterFS volume served from h3 and FUSE-mounted on h1
(tests/support/gluster.py, coherent options). For each client setting, h1 is mounted again and
the store (Posix, O_DIRECT, 4 shards, 8 I/O threads) writes then reads `--mib` MiB of 1 MiB and
of 4 MiB blocks, against `dd` streaming the same bytes into one file on the same mount (the
reference, measured in the same run); best of 2 repeats each. The settings: the defaults; 4 FUSE
reader threads (`--reader-thread-count=4`); those and the volume's `client.event-threads 4`,
`server.event-threads 4`, `performance.client-io-threads on`; the defaults again.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.support import gluster
from tests.support.netns import cluster_or_skip

# Runs on h1, in its mount namespace: argv = folder, block bytes, total bytes; one JSON line of
# the best seconds of each of "store write", "dd write", "store read", "dd read".
ON_HOST = r"""
import json, mmap, os, subprocess, sys, time
import numpy as np
import ucm_store
folder, size, total = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
n, shards = total // size, 4
shard = size // shards
best = {}
def timed(name, fn):
    t = time.perf_counter()
    fn()
    best[name] = min(best.get(name, 1e9), time.perf_counter() - t)
def ok(res):
    assert res.all_ok, res
for rep in range(2):
    backend = f"{folder}/store{rep}"
    for i in range(4096):  # a store in service: its shard folders exist
        os.makedirs(f"{backend}/{i:03x}", exist_ok=True)
    cfg = {"store_pipeline": "Posix", "storage_backends": backend, "io_direct": True}
    store = ucm_store.Store.from_config(cfg, shard_sizes=[shard] * shards)
    src = np.frombuffer(mmap.mmap(-1, n * size), np.uint8)
    src[:] = np.random.default_rng(rep).integers(0, 255, n * size, dtype=np.uint8)
    dst = np.frombuffer(mmap.mmap(-1, n * size), np.uint8)
    def blocks(a):
        at = lambda b, s: b * size + s * shard
        return [[a[at(b, s) : at(b, s + 1)] for s in range(shards)] for b in range(n)]
    keys = [os.urandom(16) for _ in range(n)]
    dd = f"{folder}/dd.bin"
    timed("store write", lambda: ok(store.wait(store.dump(keys, blocks(src)))))
    timed("dd write", lambda: subprocess.run(["dd", "if=/dev/zero", f"of={dd}", f"bs={size}", f"count={n}",
                                              "oflag=direct"], check=True, capture_output=True))
    timed("store read", lambda: ok(store.wait(store.load(keys, blocks(dst)))))
    timed("dd read", lambda: subprocess.run(["dd", f"if={dd}", "of=/dev/null", f"bs={size}", "iflag=direct"],
                                            check=True, capture_output=True))
    assert (dst == src).all(), "a block read back differs"
    store.close()
    os.unlink(dd)
print(json.dumps(best))
"""

SETTINGS = [
    ("defaults", [], {}),
    ("4 reader threads", ["--reader-thread-count=4"], {}),
    ("+ event/io threads", ["--reader-thread-count=4"],
     {"client.event-threads": "4", "server.event-threads": "4", "performance.client-io-threads": "on"}),
    ("defaults again", [], {}),
]  # fmt: skip


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mib", type=int, default=256, help="MiB written and read per block size")
    args = ap.parse_args()
    if reason := gluster.available():
        print(f"cannot run: {reason}", file=sys.stderr)
        return 2
    with cluster_or_skip(3) as hosts, gluster.gluster_volume(hosts, "ct", server="h3", clients=["h1"]) as vol:
        for i, (name, mount_options, volume_options) in enumerate(SETTINGS):
            for key, value in volume_options.items():
                vol.gluster("volume", "set", vol.name, key, value)
            vol.unmount_on("h1")
            vol.mount_on("h1", options=mount_options)
            for mib in (1, 4):
                folder = str(vol.mount / f"run{i}-{mib}")
                argv = [sys.executable, "-c", ON_HOST, folder, str(mib << 20), str(args.mib << 20)]
                done = vol.on("h1", *argv, timeout=1800)
                if done.returncode:
                    print(done.stderr[-2000:], file=sys.stderr)
                    return 1
                t = json.loads(done.stdout)
                ours = {op: t[f"store {op}"] for op in ("write", "read")}
                said = [
                    f"{op} {t[f'dd {op}'] / s:.2f}x dd ({args.mib / s:.0f} MiB/s)" for op, s in ours.items()
                ]
                print(f"{name:<20} {mib} MiB blocks: O_DIRECT " + ", cold ".join(said), flush=True)
            for key in volume_options:
                vol.gluster("volume", "reset", vol.name, key)
    return 0


if __name__ == "__main__":
    sys.exit(main())
