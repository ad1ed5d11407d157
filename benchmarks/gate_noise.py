"""Does the gate know noise? A/A and A/B runs of the CI suite on the simulator, each compared
with the results history.

    python benchmarks/gate_noise.py [--baseline 5] [--runs 10] [--slowdown 2]

In a fresh ucmctl home and history (a temporary folder): the CI suite (benchmarks/suites/ci.yaml,
three scenarios x two input lengths, each scenario deployed on this machine) is run `--baseline`
times labelled `main`; then `--runs` A/A runs (the same code and setup) and `--runs` A/B runs
with every simulated prefill `--slowdown` times dearer ($UCMCTL_SIM_PREFILL_SLOWDOWN: the
topology and provenance stay as they were, so the slowdown is what a code change would look
like), interleaved A, B, A, B so that other work on the machine hits both alike. Each is
compared as CI does, `ucmctl bench compare new.json --baseline-label main` (the last 5 `main`
runs of its provenance key, default limits 10%). Prints each verdict, the TTFT of every cell
in B against A measured in the same run, and the counts against the targets: A/A flagged 0 of
N, A/B flagged N of N.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SUITE = "benchmarks/suites/ci.yaml"


def ucmctl(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ucmctl", *args], capture_output=True, text=True,
                          env=env, cwd=ROOT, timeout=900)  # fmt: skip


def suite(env: dict[str, str], folder: Path, name: str, label: str) -> Path:
    save = folder / f"{name}.json"
    done = ucmctl(env, "bench", "suite", SUITE, "--fresh", "--results", str(folder / f"{name}.jsonl"),
                  "--save", str(save), "--label", label, "-q")  # fmt: skip
    if done.returncode != 0:
        sys.exit(f"{name}: the suite failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
    return save


def ttfts(path: Path) -> dict[str, float]:
    doc = json.loads(path.read_text())
    return {f"{c['scenario']}/{c['input_len']}": c["measure"]["mean_ttft_ms"] for c in doc["cells"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--baseline", type=int, default=5)
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--slowdown", type=float, default=2.0)
    args = parser.parse_args()
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="gate-noise-") as tmp:
        folder = Path(tmp)
        env = {**os.environ, "UCMCTL_HOME": str(folder / "home"), "UCMCTL_HISTORY": str(folder / "h.sqlite")}
        env.pop("UCMCTL_SIM_PREFILL_SLOWDOWN", None)
        slow = {**env, "UCMCTL_SIM_PREFILL_SLOWDOWN": str(args.slowdown)}
        for i in range(args.baseline):
            suite(env, folder, f"main-{i}", "main")
            print(f"baseline run {i + 1} of {args.baseline} recorded", flush=True)
        flagged = {"A/A": 0, "A/B": 0}
        ratios: dict[str, list[float]] = {}
        for i in range(args.runs):
            pair = {}
            for kind, run_env in (("A/A", env), ("A/B", slow)):
                name = f"{'aa' if kind == 'A/A' else 'ab'}-{i}"
                save = suite(run_env, folder, name, name)
                gate = ucmctl(env, "bench", "compare", str(save), "--baseline-label", "main")
                if gate.returncode not in (0, 5):
                    sys.exit(f"{name}: compare exit {gate.returncode}:\n{gate.stdout}{gate.stderr}")
                bad = [line.split("|")[1:3] for line in gate.stdout.splitlines() if "**regression**" in line]
                flagged[kind] += gate.returncode == 5
                what = ", ".join(f"{c.strip()} {m.strip()}" for c, m in bad[:3]) + (
                    ", ..." if len(bad) > 3 else ""
                )
                verdict = f"FLAGGED ({len(bad)} over: {what})" if gate.returncode == 5 else "ok"
                print(f"{kind} run {i + 1}: {verdict}", flush=True)
                pair[kind] = ttfts(save)
            for cell, a in pair["A/A"].items():
                ratios.setdefault(cell, []).append(pair["A/B"][cell] / a)
    print(f"\nTTFT mean of A/B over A/A, median over the {args.runs} pairs (slowdown {args.slowdown}x):")
    for cell, r in ratios.items():
        print(f"  {cell:16} {statistics.median(r):5.2f}x  (range {min(r):.2f}-{max(r):.2f})")
    n = args.runs
    print(f"A/A flagged {flagged['A/A']} of {n} (target 0): {'met' if flagged['A/A'] == 0 else 'NOT met'}")
    print(f"A/B flagged {flagged['A/B']} of {n} (target {n}): {'met' if flagged['A/B'] == n else 'NOT met'}")
    print(f"took {(time.monotonic() - start) / 60:.1f} min")


if __name__ == "__main__":
    main()
