"""Simulator capacity: start-to-healthy time, and whether one instance keeps a 10 ms decode
step with 128 concurrent streams of 1,000 tokens (issue targets: < 2 s; lag <= 5 %).

    python benchmarks/sim_capacity.py [--streams 128] [--tokens 1000] [--step-ms 10]

References measured in the same run: the interpreter's own start (`python -c pass`) for the
start time, and the schedule the simulator planned for its steps for the lag.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.support.openai_checks import metric
from tests.support.processes import free_port, wait_healthy


async def stream(session: aiohttp.ClientSession, url: str, tokens: int, i: int) -> list[float]:
    body = {"prompt": [i + 1, 2, 3, 4], "max_tokens": tokens, "stream": True, "ignore_eos": True}
    times = []
    async with session.post(f"{url}/v1/completions", json=body) as r:
        async for line in r.content:
            if line.startswith(b"data: {"):
                times.append(time.perf_counter())
    return times


async def load(url: str, streams: int, tokens: int) -> tuple[float, list[list[float]]]:
    connector = aiohttp.TCPConnector(limit=streams + 8)
    async with aiohttp.ClientSession(connector=connector) as session:
        start = time.perf_counter()
        runs = await asyncio.gather(*(stream(session, url, tokens, i) for i in range(streams)))
        return time.perf_counter() - start, runs


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--streams", type=int, default=128)
    ap.add_argument("--tokens", type=int, default=1000)
    ap.add_argument("--step-ms", type=float, default=10.0)
    args = ap.parse_args()

    t = time.perf_counter()
    subprocess.run([sys.executable, "-c", "pass"], check=True)
    python_start = time.perf_counter() - t

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "sim.log"
        cmd = [sys.executable, "-m", "ucmctl", "sim", "serve", "sim-model", "--host", "127.0.0.1",
               "--port", str(port), "--decode-step-ms", str(args.step_ms),
               "--max-num-seqs", str(args.streams)]  # fmt: skip
        started = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=log.open("wb"), stderr=subprocess.STDOUT)
        try:
            wait_healthy(f"{url}/health", proc, 30)
            healthy = time.perf_counter() - started
            wall, runs = asyncio.run(load(url, args.streams, args.tokens))
            import urllib.request

            text = urllib.request.urlopen(f"{url}/metrics").read().decode()
        finally:
            proc.terminate()
            proc.wait()
    planned = metric(text, "ucmctl_sim_step_planned_seconds_total")
    elapsed = metric(text, "ucmctl_sim_step_elapsed_seconds_total")
    steps = metric(text, "ucmctl_sim_steps_total")
    gaps = [b - a for r in runs for a, b in itertools.pairwise(r[1:])]
    ideal = args.tokens * args.step_ms / 1000
    complete = sum(1 for r in runs if len(r) >= args.tokens)
    print(f"start to healthy: {healthy:.2f} s ({healthy / python_start:.1f}x a bare `python -c pass` of "
          f"{python_start:.3f} s); target < 2 s")  # fmt: skip
    print(f"{args.streams} streams x {args.tokens} tokens at {args.step_ms} ms/step: {complete} complete, "
          f"{steps:.0f} steps")  # fmt: skip
    lag = 100 * (elapsed / planned - 1)
    print(f"engine: planned {planned:.2f} s, took {elapsed:.2f} s -> lag {lag:.1f} % (target <= 5 %)")
    print(f"client: wall {wall:.2f} s vs ideal {ideal:.2f} s -> {wall / ideal:.3f}x; "
          f"median inter-token gap {1000 * statistics.median(gaps):.2f} ms (p99 "
          f"{1000 * statistics.quantiles(gaps, n=100)[98]:.2f} ms)")  # fmt: skip


if __name__ == "__main__":
    main()
