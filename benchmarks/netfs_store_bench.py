"""The store's Posix tier on a real network filesystem against `dd` on the same mount, and the same
on the filesystem under the volume's brick, side by side in one run.

    sudo python benchmarks/netfs_store_bench.py [--full] [--pack-mib 16] [--repeats 5]

Three network-namespace test hosts, a GlusterFS volume served from h3 and FUSE-mounted on h1
(tests/support/gluster.py, the coherent client options docs/storage.md recommends).
`benchmarks/store_bench.py --only posix` runs twice: in h1's namespaces with its scratch folder
on the mount, then on this machine's own filesystem beside the brick. Each prints the store's
O_DIRECT and buffered write and cold read against `dd` on that same filesystem, and with
`--pack-mib N` (16 by default) the same O_DIRECT store's blocks written and read as packs of
about N MiB (`Store.write_pack` / `read_pack`, csrc/README.md "Packs").

Target (issue #25): on the mount, the store's O_DIRECT write and cold read >= 0.9x dd.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.support import gluster
from tests.support.netns import cluster_or_skip

BENCH = Path(__file__).with_name("store_bench.py")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--full", action="store_true", help="store_bench's full set of shapes (slow)")
    ap.add_argument("--pack-mib", type=int, default=16, help="pack size to measure beside (0: none)")
    ap.add_argument("--repeats", type=int, default=5, help="repeats per shape (the ratio is their median)")
    args = ap.parse_args()
    if reason := gluster.available():
        print(f"cannot run: {reason}", file=sys.stderr)
        return 2
    argv = [sys.executable, str(BENCH), "--only", "posix", "--pack-mib", str(args.pack_mib)]
    argv += ["--repeats", str(args.repeats)]
    argv += [] if args.full else ["--quick"]
    with cluster_or_skip(3) as hosts, gluster.gluster_volume(hosts, "sb", server="h3", clients=["h1"]) as vol:
        print("== on the GlusterFS mount (h1's client, volume served from h3)", flush=True)
        done = vol.on("h1", *argv, "--target", "0.9", "--dir", str(vol.mount / "bench"), timeout=3600)
        print(done.stdout + done.stderr, flush=True)
        if done.returncode:
            return 1
        print("== on the brick's own filesystem (this machine's disk)", flush=True)
        local = subprocess.run([*argv, "--dir", str(vol.base / "local-bench")], text=True, check=False)
        return local.returncode


if __name__ == "__main__":
    sys.exit(main())
