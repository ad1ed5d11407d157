"""How long a healthy KV load takes over a real network filesystem: the figure behind the default
load bound (`load_timeout_s`, 5 s).

    sudo python benchmarks/netfs_load_time.py [--tokens 4096] [--repeats 5]

Three network-namespace test hosts, a GlusterFS volume served from h3 and mounted on h1 and h2
(tests/support/gluster.py, coherent client options). h1 stores one prompt's KV through its client,
as a prefill server's store does; h2 loads it through its own client, as a decode server's does
(the store's Posix tier, 8 I/O threads, blocks of 16 tokens), timed per load. Two KV sizes per
token: a 0.5B-class model (24 layers x 2 x 2 heads x 64 x bf16 = 12 KiB) and an 8B-class one
(32 layers x 2 x 8 heads x 128 x bf16 = 128 KiB). Printed: median and worst load time of the
whole prompt, its GB/s, and the bound over the worst (how much headroom the default leaves).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.support import gluster
from tests.support.netns import cluster_or_skip
from ucmctl.core.ucm_config import DEFAULT_LOAD_TIMEOUT_S

CLIENT = r"""
import hashlib, json, sys, time
import numpy as np, ucm_store
op, backend, blocks, shard, layers, repeats = sys.argv[1], sys.argv[2], *map(int, sys.argv[3:7])
sizes = [shard] * layers
cfg = {"store_pipeline": "Posix", "storage_backends": backend}
keys = [hashlib.blake2b(f"{shard}:{i}".encode(), digest_size=16).digest() for i in range(blocks)]
with ucm_store.Store.from_config(cfg, shard_sizes=sizes) as store:
    if op == "dump":
        data = [[np.full(shard, i % 251, np.uint8) for _ in sizes] for i in range(blocks)]
        assert store.wait(store.dump(keys, data), timeout=600).all_ok and store.flush(600)
        print(json.dumps({"stored": blocks}))
    else:
        out = [[np.empty(shard, np.uint8) for _ in sizes] for _ in range(blocks)]
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            res = store.wait(store.load(keys, out), timeout=600)
            times.append(time.perf_counter() - t0)
            assert res.all_ok, res.errors[:3]
        assert all(int(b[0][0]) == i % 251 for i, b in enumerate(out))
        print(json.dumps({"times": times}))
"""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    if reason := gluster.available():
        print(f"cannot run: {reason}", file=sys.stderr)
        return 2
    blocks = args.tokens // 16
    models = {"0.5B-class": (16 * 2 * 2 * 64 * 2, 24), "8B-class": (16 * 2 * 8 * 128 * 2, 32)}
    with tempfile.TemporaryDirectory() as tmp:
        client = Path(tmp) / "client.py"
        client.write_text(CLIENT)
        client.chmod(0o644)
        with cluster_or_skip(3) as hosts, gluster.gluster_volume(hosts, "lt", server="h3",
                                                                 clients=["h1", "h2"]) as vol:  # fmt: skip
            print(f"one {args.tokens}-token prompt's KV ({blocks} blocks of 16 tokens), stored via h1, "
                  f"loaded via h2, GlusterFS from h3; {args.repeats} loads each")  # fmt: skip
            print(f"{'model':<11} {'MiB':>6} {'median s':>9} {'worst s':>8} {'GB/s':>6} {'bound/worst':>11}")
            for name, (shard, layers) in models.items():
                backend = str(vol.mount / name)
                common = [backend, str(blocks), str(shard), str(layers), str(args.repeats)]
                for host, op in (("h1", "dump"), ("h2", "load")):
                    done = vol.on(host, sys.executable, str(client), op, *common, timeout=900)
                    if done.returncode:
                        print(done.stderr[-2000:], file=sys.stderr)
                        return 1
                times = json.loads(done.stdout.splitlines()[-1])["times"]
                nbytes = blocks * shard * layers
                worst = max(times)
                print(f"{name:<11} {nbytes / 2**20:>6.0f} {statistics.median(times):>9.3f} {worst:>8.3f} "
                      f"{nbytes / statistics.median(times) / 1e9:>6.2f} "
                      f"{DEFAULT_LOAD_TIMEOUT_S / worst:>10.1f}x")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
