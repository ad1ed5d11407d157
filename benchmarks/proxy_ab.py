"""The proxy of this tree against the proxy of another revision, side by side on one simulator:
what a change to the request path costs (or saves) when nothing fails.

    python benchmarks/proxy_ab.py --against REV [--rounds 5] [--requests 200] [--concurrency 128]
                                  [--tokens 256]

REV is checked out in a git worktree of its own (under the system's temporary folder); its proxy
runs from there with this tree's native modules (`ucmctl.proxy._kv`, `_sse`: a change to csrc/
is not what this compares). One zero-cost simulator; the two proxies in front of it, the same
flags; rounds alternate which goes first. Each round, for each proxy: one stream of --requests
one-token answers (added TTFT p50 against the simulator directly, measured in the same round),
then --concurrency streams of --tokens tokens (throughput, and the proxy's CPU per token from
/proc). Printed: each figure's median over rounds for both, and this tree's against REV's.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent))
from proxy_overhead import HOST, free_port, measured, pct, processes, run_load, start, wait_healthy

REPO = Path(__file__).resolve().parents[1]
# runs `python -m ucmctl.proxy` from the tree given first, not this one's editable install
OLD_PROXY = """
import runpy, sys
sys.meta_path[:] = [f for f in sys.meta_path if "editable" not in type(f).__module__]
sys.path.insert(0, sys.argv.pop(1))
runpy.run_module("ucmctl.proxy", run_name="__main__", alter_sys=True)
"""


def worktree(rev: str) -> Path:
    """REV checked out (once) in a worktree of its own, with this tree's native modules."""
    sha = subprocess.run(["git", "rev-parse", rev], cwd=REPO, capture_output=True, text=True, check=True)
    where = Path(tempfile.gettempdir()) / f"ucmctl-ab-{sha.stdout.strip()[:12]}"
    if not where.exists():
        subprocess.run(["git", "worktree", "add", "--detach", str(where), rev], cwd=REPO, check=True,
                       capture_output=True)  # fmt: skip
    import ucmctl.proxy._kv as kv
    import ucmctl.proxy._sse as sse

    for module in (kv, sse):
        built = Path(str(module.__file__))
        link = where / "ucmctl" / "proxy" / built.name
        if not link.exists():
            link.symlink_to(built)
    # the reference's proxy is REV's code, not this tree's
    said = OLD_PROXY.replace('runpy.run_module("ucmctl.proxy", run_name="__main__", alter_sys=True)',
                             "import ucmctl.proxy.flow as f; print(f.__file__)")  # fmt: skip
    found = subprocess.run(
        [sys.executable, "-c", said, str(where)], capture_output=True, text=True, check=True
    )
    assert found.stdout.strip().startswith(str(where)), found.stdout
    return where


async def main_async(args: argparse.Namespace) -> None:
    old = worktree(args.against)
    ports = {name: free_port() for name in ("sim", "new", "old")}
    url = {name: f"http://{HOST}:{port}" for name, port in ports.items()}
    py = sys.executable
    sim = [py, "-m", "ucmctl", "sim", "serve", "sim-model", "--host", HOST, "--port", str(ports["sim"]),
           "--profile", "zero", "--max-num-seqs", "512"]  # fmt: skip
    flags = ["--mode", "mixed", "--instance", url["sim"]]
    with processes() as procs:
        start(procs, sim)
        start(procs, [py, "-m", "ucmctl.proxy", "--host", HOST, "--port", str(ports["new"]), *flags])
        start(procs, [py, "-c", OLD_PROXY, str(old), "--host", HOST, "--port", str(ports["old"]), *flags])
        pids = {"new": procs[1].pid, "old": procs[2].pid}
        timeout = aiohttp.ClientTimeout(total=600)
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), timeout=timeout) as s:
            for u in url.values():
                await wait_healthy(s, u)
            ttft: dict[str, list[float]] = {"new": [], "old": []}
            speed: dict[str, list[float]] = {"new": [], "old": []}
            cpu: dict[str, list[float]] = {"new": [], "old": []}
            for name in ("new", "old"):  # warm up
                await run_load(s, url[name], streams=8, requests=16, tokens=args.tokens)
            for rnd in range(args.rounds):
                order = ["new", "old"] if rnd % 2 == 0 else ["old", "new"]
                direct = await run_load(s, url["sim"], streams=1, requests=args.requests, tokens=1)
                for name in order:
                    one = await run_load(s, url[name], streams=1, requests=args.requests, tokens=1)
                    ttft[name].append((pct(one.ttft, 0.5) - pct(direct.ttft, 0.5)) * 1e3)
                    load = {
                        "streams": args.concurrency,
                        "requests": 2 * args.concurrency,
                        "tokens": args.tokens,
                    }
                    many, per_token = await measured(s, url[name], {"proxy": pids[name]}, **load)
                    speed[name].append(many.tokens / many.seconds)
                    cpu[name].append(per_token["proxy"])
                new, old = (f"{ttft[n][-1]:+.3f} ms, {cpu[n][-1]:.2f} us/token" for n in ("new", "old"))
                print(f"round {rnd + 1}: added TTFT p50, CPU: new {new}; old {old}", flush=True)
    med = {k: {n: statistics.median(v[n]) for n in v} for k, v in (("ttft", ttft), ("speed", speed))}
    med["cpu"] = {n: statistics.median(cpu[n]) for n in cpu}
    t, c, v = med["ttft"], med["cpu"], med["speed"]
    print(f"this tree against {args.against} (mixed, a zero-cost simulator, {args.rounds} rounds, medians):")
    print(f"  added TTFT p50, one stream: {t['new']:+.3f} against {t['old']:+.3f} ms "
          f"({t['new'] - t['old']:+.3f} ms)")  # fmt: skip
    print(f"  proxy CPU per token at {args.concurrency} streams: {c['new']:.2f} against {c['old']:.2f} us "
          f"({c['new'] / c['old']:.3f}x)")  # fmt: skip
    print(f"  throughput at {args.concurrency} streams: {v['new']:.0f} against {v['old']:.0f} tokens/s "
          f"({v['new'] / v['old']:.3f}x)")  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--against", required=True, help="a git revision: the reference")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--requests", type=int, default=200, help="one-token answers a round, one at a time")
    ap.add_argument("--concurrency", type=int, default=128)
    ap.add_argument("--tokens", type=int, default=256)
    asyncio.run(main_async(ap.parse_args()))


if __name__ == "__main__":
    main()
