"""How fast `ucmctl bench history` answers over a history of 1,000 stored runs.

    python benchmarks/history_speed.py [--runs 1000] [--rounds 5]

Fills a fresh history (a temporary folder) with `--runs` runs shaped as the CI suite's result
(benchmarks/baselines/ci-sim.json: six cells, its whole document stored with each run, figures
varied per run), then times, as a user types them, the commands below against the start of
`ucmctl --version` (the reference: what any ucmctl command costs before it reads anything), each
the median of `--rounds` runs, interleaved so that other work on the machine hits all alike.
Target: every listing answers in < 1 s.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ucmctl.bench import history

TARGET_S = 1.0
BASELINE = Path(__file__).resolve().parent / "baselines" / "ci-sim.json"
COMMANDS = {
    "ucmctl --version (reference)": ["--version"],
    "bench history": ["bench", "history"],
    "bench history --label nightly --since 30d": ["bench", "history", "--label", "nightly", "--since", "30d"],
    "bench history --last 1000 --cell 'ucm/*'": ["bench", "history", "--last", "1000", "--cell", "ucm/*"],
    "bench history --last 1000": ["bench", "history", "--last", "1000"],
}


def fill(path: Path, runs: int) -> float:
    base = json.loads(BASELINE.read_text())
    rng = random.Random(0)
    start = time.perf_counter()
    for i in range(runs):
        doc = copy.deepcopy(base)
        for cell in doc["cells"]:
            m = cell["measure"]
            for key in ("mean_ttft_ms", "median_ttft_ms", "p99_ttft_ms", "mean_tpot_ms", "mean_e2el_ms"):
                m[key] *= rng.uniform(0.9, 1.1)
        label = "nightly" if i % 2 else f"pr-{i}"
        history.record(path, doc, command="suite", deployment="ci-sim", label=label)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="history-speed-") as folder:
        path = Path(folder) / "history.sqlite"
        took = fill(path, args.runs)
        size = path.stat().st_size
        print(f"stored {args.runs} runs of 6 cells in {took:.1f} s ({size / 2**20:.1f} MiB, "
              f"{size / args.runs / 1024:.1f} KiB a run)")  # fmt: skip
        env = {**os.environ, "UCMCTL_HISTORY": str(path), "COLUMNS": "80"}
        times: dict[str, list[float]] = {name: [] for name in COMMANDS}
        lines: dict[str, int] = {}
        for _ in range(args.rounds):
            for name, argv in COMMANDS.items():
                t0 = time.perf_counter()
                done = subprocess.run([sys.executable, "-m", "ucmctl", *argv], capture_output=True, text=True,
                                      env=env, check=True)  # fmt: skip
                times[name].append(time.perf_counter() - t0)
                lines[name] = len(done.stdout.splitlines())
    reference = statistics.median(times["ucmctl --version (reference)"])
    print(f"{'command':45} {'median s':>9} {'x ref':>6} {'lines':>6}")
    worst = 0.0
    for name, ts in times.items():
        median = statistics.median(ts)
        if name != "ucmctl --version (reference)":
            worst = max(worst, median)
        print(f"{name:45} {median:9.3f} {median / reference:6.2f} {lines[name]:6d}")
    verdict = "met" if worst < TARGET_S else "NOT met"
    print(f"slowest listing {worst:.3f} s: target < {TARGET_S:.0f} s {verdict}")


if __name__ == "__main__":
    main()
