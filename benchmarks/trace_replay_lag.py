"""Trace replay send lag: does `ucmctl bench --workload trace` send each request when the
trace says? (target: send lag p99 <= 5 ms at 100 requests/s).

    python benchmarks/trace_replay_lag.py [--requests 1200] [--rate 100] [--runs 3]

One synthetic trace (`ucmctl bench make-trace`, Poisson arrivals at --rate, short prompts and
answers) replayed on its timestamps against one zero-cost simulator, --runs times (a fresh
prompt seed each run, so nothing hits the previous run's cache). Each run prints the send lag
(p50 / p99 / max, from the saved JSON's `send_lag_ms`) and, as the reference measured in the same
run, the trace's own mean inter-arrival time (10 ms at 100 requests/s): lag p99 / inter-arrival.

Before each replay a bare asyncio process (no HTTP, no bodies: `BARE` below, on the harness's
event loop) waits for the same timestamps the way the harness does (sleep to 1.5 ms before each,
then yield) and records how late it woke: the machine's own scheduling noise at that moment,
printed next to the replay's lag, with the share of CPU time the hypervisor stole from this
machine during the replay (/proc/stat's steal: a virtual machine's noise no client can avoid).
`--loop asyncio` replays on asyncio's own loop (and the bare process too) instead of uvloop, for
comparison.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.support import bench_cli
from tests.support.processes import sim_server
from ucmctl.bench import loop

REPO = Path(__file__).resolve().parents[1]


def make_trace(path: Path, requests: int, rate: float, input_len: int, output_len: int, seed: int) -> str:
    return bench_cli.make_trace(
        path, "--requests", str(requests), "--rate", str(rate), "--input-len", str(input_len),
        "--output-len", str(output_len), "--pattern", "unique", "--seed", str(seed),
    )  # fmt: skip


def inter_arrival_ms(path: Path) -> float:
    stamps = [json.loads(line)["timestamp"] for line in path.read_text().splitlines() if line.strip()]
    return (stamps[-1] - stamps[0]) / (len(stamps) - 1)


BARE = """
import asyncio, json, sys, time
import numpy as np
stamps = [json.loads(x)["timestamp"] / 1000 for x in open(sys.argv[1]) if x.strip()]
async def main():
    lags, start = [], time.perf_counter()
    for due in stamps:
        while (delay := start + due - time.perf_counter()) > 0:
            await asyncio.sleep(delay - 0.0015 if delay > 0.002 else 0)
        lags.append(time.perf_counter() - start - due)
    a = np.asarray(lags) * 1000
    p50, p99 = np.percentile(a, [50, 99])
    print(json.dumps({"p50": float(p50), "p99": float(p99), "max": float(a.max())}))
from ucmctl.bench import loop  # the harness's own choice of loop
loop.run(main())
"""


def bare_loop(trace: Path) -> dict:
    """How late a bare asyncio loop wakes for the trace's timestamps (ms p50/p99/max)."""
    done = subprocess.run(
        [sys.executable, "-c", BARE, str(trace)], capture_output=True, text=True, check=True, cwd=REPO
    )
    return json.loads(done.stdout)


def cpu_times() -> list[int]:
    """This machine's CPU time so far (/proc/stat's `cpu` line: user ... steal), in ticks."""
    with open("/proc/stat") as f:
        return [int(x) for x in f.readline().split()[1:9]]


def steal_share(before: list[int], after: list[int]) -> float:
    """The share of CPU time the hypervisor took from this machine between two readings: time
    no process here could run, whatever the harness does."""
    spent = [b - a for a, b in zip(before, after, strict=True)]
    return spent[7] / max(1, sum(spent))


def replay(url: str, model_dir: Path, trace: Path, seed: int, out: Path) -> dict:
    doc = bench_cli.bench_json(
        url, model_dir, out, "--workload", "trace", "--trace", str(trace), "--seed", str(seed)
    )
    return doc["cells"][0]["measure"]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=1200)
    ap.add_argument("--rate", type=float, default=100.0)
    ap.add_argument("--input-len", type=int, default=64)
    ap.add_argument("--output-len", type=int, default=8)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--model-dir", type=Path, default=REPO / ".models" / "medium")
    ap.add_argument("--loop", choices=["default", "asyncio"], default="default")
    args = ap.parse_args()
    if args.loop == "asyncio":
        os.environ["UCMCTL_EVENT_LOOP"] = "asyncio"  # read by ucmctl.bench.loop, here and below
    print("load average at start: {:.2f} {:.2f} {:.2f}".format(*os.getloadavg()), flush=True)
    print(f"event loop: {loop.name()}", flush=True)

    rows, bares = [], []
    with tempfile.TemporaryDirectory(prefix="ucm-lag-") as tmp_name:
        tmp = Path(tmp_name)
        trace = tmp / "trace.jsonl"
        print(make_trace(trace, args.requests, args.rate, args.input_len, args.output_len, seed=0))
        gap = inter_arrival_ms(trace)
        flags = ("--profile", "zero", "--max-num-seqs", "1024")
        with sim_server(tmp, *flags, model=str(args.model_dir), timeout=60) as srv:
            for run in range(args.runs):
                bare = bare_loop(trace)
                bares.append(bare)
                before = cpu_times()
                m = replay(srv.url, args.model_dir, trace, seed=100 + run, out=tmp / f"run{run}.json")
                steal = steal_share(before, cpu_times())
                lag = m["send_lag_ms"]
                rows.append(lag)
                print(
                    f"run {run + 1}: {m['completed']} ok, {m['failed']} failed, "
                    f"{m['request_throughput']:.1f} req/s; send lag p50 {lag['p50']:.2f} ms, "
                    f"p99 {lag['p99']:.2f} ms, max {lag['max']:.2f} ms "
                    f"(p99 / inter-arrival {lag['p99'] / gap:.3f}); bare asyncio loop just before: "
                    f"p50 {bare['p50']:.2f}, p99 {bare['p99']:.2f}, max {bare['max']:.2f} ms; "
                    f"CPU stolen by the hypervisor during the replay: {steal:.1%}"
                )
    print(
        f"trace: {args.requests} requests at {args.rate:g}/s (mean inter-arrival {gap:.2f} ms), "
        f"{args.input_len}-token prompts, {args.output_len}-token answers, zero-cost simulator"
    )
    worst = max(r["p99"] for r in rows)
    met = all(r["p99"] <= 5.0 for r in rows)
    print(
        f"send lag p99 over {len(rows)} runs: "
        + ", ".join(f"{r['p99']:.2f}" for r in rows)
        + f" ms; worst {worst:.2f} ms = {worst / gap:.3f} x inter-arrival; "
        f"target p99 <= 5 ms: {'met' if met else 'NOT met'}"
    )


if __name__ == "__main__":
    main()
    print("load average at end: {:.2f} {:.2f} {:.2f}".format(*os.getloadavg()))
