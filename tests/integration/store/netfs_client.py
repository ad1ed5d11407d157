"""A store client on one test host, for the network filesystem tests (not a test module).

usage (from the checkout's root):
    python -m tests.integration.store.netfs_client dump|load|reload|poll BACKEND COUNT [NAMESPACE] [SECONDS]
dump stores blocks key(0..COUNT) and flushes; load reads them into buffers filled with 0xAB
first, then prints one JSON line: how many loaded, how many delivered the right bytes, how many
buffers of a failed load are still untouched, the reasons, and the store's read counters. poll
loads them again and again for SECONDS (while another host writes them) and counts the blocks
delivered right and wrong. reload loads, prints, waits for a line on stdin (the test changes
the files meanwhile), then loads again and prints, in one process (the same client's caches).
"""

from __future__ import annotations

import json
import sys
import time

import ucm_store

from tests.support.blocks import block, empty, key, same

SHARDS = [16384, 16384]


def main() -> int:
    op, backend, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
    ns = sys.argv[4] if len(sys.argv) > 4 else "netfs"
    cfg = {"store_pipeline": "Posix", "storage_backends": backend, "io_direct": True}
    keys = [key(i, ns) for i in range(count)]
    with ucm_store.Store.from_config(cfg, shard_sizes=SHARDS) as store:
        if op == "dump":
            res = store.wait(store.dump(keys, [block(k, SHARDS) for k in keys]), timeout=120)
            assert store.flush(timeout=120)
            failed = sorted({e for e in res.errors if e})[:3]
            print(json.dumps({"stored": res.ok.count(True), **({"errors": failed} if failed else {})}))
            return 0
        if op == "poll":
            end, delivered, right, passes = time.monotonic() + float(sys.argv[5]), 0, 0, 0
            while time.monotonic() < end:
                buffers = [empty(SHARDS, fill=0xAB) for _ in keys]
                res = store.wait(store.load(keys, buffers), timeout=120)
                passes += 1
                for k, b, good in zip(keys, buffers, res.ok, strict=True):
                    delivered += good
                    right += good and same(b, block(k, SHARDS))
            print(json.dumps({"passes": passes, "delivered": delivered, "right": right}))
            return 0
        if op == "reload":
            print(json.dumps(load_all(store, keys)), flush=True)
            sys.stdin.readline()
        print(json.dumps(load_all(store, keys)))
    return 0


def load_all(store: ucm_store.Store, keys: list[bytes]) -> dict:
    """Every block into a buffer filled with 0xAB first: loaded, right, untouched, why, counters."""
    buffers = [empty(SHARDS, fill=0xAB) for _ in keys]
    res = store.wait(store.load(keys, buffers), timeout=120)
    ok = list(res.ok)
    right = sum(same(b, block(k, SHARDS)) for k, b, good in zip(keys, buffers, ok, strict=True) if good)
    failed = [b for b, good in zip(buffers, ok, strict=True) if not good]
    untouched = sum(all((s == 0xAB).all() for s in b) for b in failed)
    stats = {k: v for k, v in store.stats().items() if k.startswith("posix_read") or k == "load_errors"}
    reasons = sorted({e for e in res.errors if e})[:3]
    return {"loaded": ok.count(True), "right": right, "untouched": untouched, "reasons": reasons,
            "stats": stats}  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
