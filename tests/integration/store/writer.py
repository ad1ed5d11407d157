"""Writer process for the crash and contention tests (not a test module).

usage (from the checkout's root):
    python -m tests.integration.store.writer BACKEND PIPELINE NAMESPACE FIRST COUNT BATCH [GO_FILE] [SEED]
Dumps blocks key(FIRST..FIRST+COUNT) in batches, printing one line per finished batch.
"""

from __future__ import annotations

import random
import sys
import time
from pathlib import Path

import ucm_store

from tests.support.blocks import block, key

SHARDS = [2048, 2048, 2048, 1000]


def main() -> int:
    backend, pipeline, ns, first, count, batch = sys.argv[1:7]
    go = sys.argv[7] if len(sys.argv) > 7 else ""
    seed = int(sys.argv[8]) if len(sys.argv) > 8 else -1
    ids = list(range(int(first), int(first) + int(count)))
    if seed >= 0:
        random.Random(seed).shuffle(ids)
    cfg = {
        "store_pipeline": pipeline,
        "storage_backends": backend,
        "cache_buffer_capacity_gb": 0.01,
        "io_direct": True,
    }
    store = ucm_store.Store.from_config(cfg, shard_sizes=SHARDS)
    if go:
        while not Path(go).exists():
            time.sleep(0.001)
    failed = 0
    step = int(batch)
    for at in range(0, len(ids), step):
        keys = [key(i, ns) for i in ids[at : at + step]]
        res = store.wait(store.dump(keys, [block(k, SHARDS) for k in keys]))
        failed += res.ok.count(False)
        print(f"batch {at // step} failed {failed}", flush=True)
    assert store.flush(timeout=60)
    st = store.stats()
    store.close()
    written, skipped = st["posix_blocks_written"], st["posix_write_skipped"]
    print(f"done failed {failed} written {written} skipped {skipped}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
