"""The centralized 2P2D simulator benchmark with its store on a GlusterFS volume against the same run
with the store on the hosts' local filesystem: the measured external hit rate must not suffer.

    sudo python benchmarks/netfs_hits.py [--prompts 32] [--input-len 1024] [--pack-blocks 16]

Three network-namespace test hosts with real sshd: prefill (2 servers) on h1, decode (2 servers)
on h2, the proxy on h1; GlusterFS served from h3, mounted on h1 and h2 with the coherent client
options; the local case shares one folder of this machine between the hosts. `ucmctl up`, then
`ucmctl bench --prefix-ratio 0.8` (preseed, then measure), then `ucmctl down`, for each backend,
with the same seed. With `--pack-blocks N` (N > 1) each backend runs twice, a file per block and
then `storage.pack_blocks: N` (N consecutive blocks of a prompt in one file), on a fresh folder.

Target (issue #25): the external hit rate over GlusterFS within 2 points of the local one.
Judged on the hit rate (local + external, over all four servers): which server the proxy picks for
a prompt decides whether its prefix is a local (HBM) hit there or an external one (the store), and
that varies from run to run on either filesystem (external alone: 52-78% over four local runs);
the sum does not, and a block the filesystem failed to show would lower it.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.support import gluster
from tests.support.cli import Cli
from tests.support.netns import cluster_or_skip
from tests.support.topology import node_lines


def topology(hosts, name: str, backend: Path, pack_blocks: int) -> str:  # type: ignore[no-untyped-def]
    packs = f", pack_blocks: {pack_blocks}" if pack_blocks > 1 else ""
    return f"""
name: {name}
mode: centralized
engine: sim
model: {{path: sim-model}}
nodes:
{node_lines(hosts, ["h1", "h2"])}
storage: {{storage_backends: {backend}, cache_buffer_capacity_gb: 0.25{packs}}}
prefill: {{nodes: [h1], servers_per_node: 2, port: 8100, flags: {{block-size: 16, kv-bytes-per-token: 2048}}}}
decode: {{nodes: [h2], servers_per_node: 2, port: 8200, flags: {{block-size: 16, kv-bytes-per-token: 2048}}}}
proxy: {{node: h1, port: 8000}}
"""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--input-len", type=int, default=1024)
    ap.add_argument("--pack-blocks", type=int, default=16, help="1: a file per block only")
    args = ap.parse_args()
    if reason := gluster.available():
        print(f"cannot run: {reason}", file=sys.stderr)
        return 2
    rows, files = {}, {}
    with (
        tempfile.TemporaryDirectory() as tmp,
        cluster_or_skip(3) as hosts,
        gluster.gluster_volume(hosts, "hits", server="h3", clients=["h1", "h2"]) as vol,
    ):
        cli = Cli(Path(tmp) / "home", hosts.ssh_config)
        # (name, the store's folder, the same folder as this process sees it, pack_blocks): the
        # volume is mounted in the hosts' mount namespaces; its files are on the brick here
        cases = [
            (f"{fs}{'' if n == 1 else f'+packs{n}'}", where / sub, seen / sub, n)
            for fs, where, seen in (
                ("local", hosts.shared / "hits-local", hosts.shared / "hits-local"),
                ("glusterfs", vol.mount, vol.brick),
            )
            for n in sorted({1, args.pack_blocks})
            for sub in ["kv" if n == 1 else f"kv-packs{n}"]
        ]
        for name, backend, seen, pack_blocks in cases:
            topo = Path(tmp) / f"{name}.yaml"
            dep = f"hits-{name.replace('+', '-')}"
            topo.write_text(topology(hosts, dep, backend, pack_blocks))
            up = cli("up", str(topo))
            if up.returncode:
                print(up.stderr[-3000:], file=sys.stderr)
                return 1
            try:
                save = Path(tmp) / f"{name}.json"
                bench = cli("bench", "-d", dep, "--prefix-ratio", "0.8", "--input-len",
                            str(args.input_len), "--output-len", "16", "--num-prompts", str(args.prompts),
                            "--seed", "7", "--save", str(save), "-q", timeout=1800)  # fmt: skip
                if bench.returncode:
                    print(bench.stderr[-3000:], file=sys.stderr)
                    return 1
                (cell,) = json.loads(save.read_text())["cells"]
                rows[name] = cell["measure"]
                files[name] = sum(1 for f in seen.rglob("*") if f.is_file())
            finally:
                cli("down", dep)
    print(f"2P2D centralized sim, {args.prompts} prompts of {args.input_len} tokens, prefix ratio 0.8")
    heads = ("failed", 6), ("hit", 6), ("external", 8), ("decode ext.", 11), ("p99 TTFT ms", 11), ("files", 6)
    print(f"{'store on':<17} " + " ".join(f"{h:>{w}}" for h, w in heads))
    for name, m in rows.items():
        total, dec = m["hit_rate"]["total"], m["hit_rate"]["by_role"]["decode"]
        hit, ext = total["hit_rate"] or 0.0, total["external_hit_rate"] or 0.0
        figures = f"{100 * hit:>5.1f}% {100 * ext:>7.1f}% {100 * (dec['external_hit_rate'] or 0.0):>10.1f}%"
        print(f"{name:<17} {m['failed']:>6} {figures} {m['p99_ttft_ms']:>11.1f} {files[name]:>6}")
    hits = {name: m["hit_rate"]["total"]["hit_rate"] or 0.0 for name, m in rows.items()}
    worst = 0.0
    for name in rows:
        if name.startswith("glusterfs"):
            gap = 100 * abs(hits[name] - hits["local"])
            worst = max(worst, gap)
            print(f"hit rate (local + external), {name} against local: {gap:.2f} points apart (target <= 2)")
    return 0 if worst <= 2 else 1


if __name__ == "__main__":
    sys.exit(main())
