"""How long a healthy KV load takes over a real network filesystem: the figure behind the default
load bound (`load_timeout_s`, 5 s).

    sudo python benchmarks/netfs_load_time.py [--tokens 4096] [--repeats 5]

Three network-namespace test hosts, a GlusterFS volume served from h3 and mounted on h1 and h2
(tests/support/gluster.py, coherent client options). h1 stores one prompt's KV through its client,
as a prefill server's store does; h2 loads it through its own client, as a decode server's does
(the store's Posix tier, 8 I/O threads, blocks of 16 tokens), timed per load. Two KV sizes per
token: a 0.5B-class model (24 layers x 2 x 2 heads x 64 x bf16 = 12 KiB) and an 8B-class one
(32 layers x 2 x 8 heads x 128 x bf16 = 128 KiB). Printed: median and worst load time of the
whole prompt, its GB/s, the load's bound (the default `load_timeout_s` grown by the load's bytes,
`ucmctl.core.ucm_config.load_bound`) and that bound over the worst (the headroom it leaves), each
load's seconds and the blocks it gave up: each load is bounded as the connector bounds it
(`Store.finish_within` with that bound and the stall bound, half of `load_timeout_s`).
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
from ucmctl.core.ucm_config import DEFAULT_LOAD_TIMEOUT_S, load_bound, stall_bound

CLIENT = r"""
import hashlib, json, sys, time
import numpy as np, ucm_store
op, backend, blocks, shard, layers, repeats = sys.argv[1], sys.argv[2], *map(int, sys.argv[3:7])
bound, stall = map(float, sys.argv[7:9])
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
        times, given_up = [], []
        for _ in range(repeats):
            t0 = time.perf_counter()  # bounded as the connector bounds it
            res = store.finish_within(store.load(keys, out), bound, op="load", stall_s=stall)
            times.append(time.perf_counter() - t0)
            given_up.append(res.ok.count(False))
            if res.all_ok:
                assert all(int(b[0][0]) == i % 251 for i, b in enumerate(out))
            else:
                print(res.errors[res.ok.index(False)], file=sys.stderr)
        print(json.dumps({"times": times, "given_up": given_up}))
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
            print(f"{'model':<11} {'MiB':>6} {'median s':>9} {'worst s':>8} {'GB/s':>6} {'bound s':>8} "
                  f"{'bound/worst':>11}")  # fmt: skip
            for name, (shard, layers) in models.items():
                backend = str(vol.mount / name)
                nbytes = blocks * shard * layers
                bound, stall = load_bound(DEFAULT_LOAD_TIMEOUT_S, nbytes), stall_bound(DEFAULT_LOAD_TIMEOUT_S)
                common = [
                    backend,
                    str(blocks),
                    str(shard),
                    str(layers),
                    str(args.repeats),
                    str(bound),
                    str(stall),
                ]
                for host, op in (("h1", "dump"), ("h2", "load")):
                    done = vol.on(host, sys.executable, str(client), op, *common, timeout=900)
                    if done.returncode:
                        print(done.stderr[-2000:], file=sys.stderr)
                        return 1
                got = json.loads(done.stdout.splitlines()[-1])
                times, worst = got["times"], max(got["times"])
                print(f"{name:<11} {nbytes / 2**20:>6.0f} {statistics.median(times):>9.3f} {worst:>8.3f} "
                      f"{nbytes / statistics.median(times) / 1e9:>6.2f} {bound:>8.1f} "
                      f"{bound / worst:>10.1f}x   loads: {' '.join(f'{t:.2f}' for t in times)}"
                      f"   blocks given up: {' '.join(map(str, got['given_up']))}")  # fmt: skip
                if any(got["given_up"]):
                    print(done.stderr.strip()[-1000:])
    return 0


if __name__ == "__main__":
    sys.exit(main())
