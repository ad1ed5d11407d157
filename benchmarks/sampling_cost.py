"""What reading every instance's /metrics each second costs the measured phase.

    python benchmarks/sampling_cost.py [--rounds 5] [--num-prompts 800] [--concurrency 64]

Deploys a 1P1D of the simulator on this machine (`ucmctl up`: a prefill and a decode server and
the proxy, in a temporary folder), then runs `ucmctl bench` (one measure phase, no preseed)
alternately with `--sample-interval 0` (the reference: no reads), `1` (the default) and `0.1`
(ten times as many reads, to show the cost grows with them), `--rounds` times each, so that
other work on the machine hits all alike. Prints the median output throughput of each and its
ratio to the reference. Target: sampling every second costs <= 2% of the throughput.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TARGET = 0.02
BENCH = ["bench", "--prefix-ratio", "0", "--input-len", "256", "--output-len", "64", "-q"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def topology(folder: Path) -> Path:
    path = folder / "sampling.yaml"
    work = json.dumps(str(folder / "work"))
    path.write_text(f"""
name: sampling-cost
mode: centralized
engine: sim
model: {{path: sim-model}}
nodes:
  me: {{host: 127.0.0.1, transport: local, platform: cpu, python: {sys.executable}, workdir: {work}}}
storage: {{storage_backends: {json.dumps(str(folder / "store"))}, cache_buffer_capacity_gb: 0.25}}
prefill: {{nodes: [me], port: {free_port()}, flags: {{prefill-us-per-token: 20, max-num-seqs: 256}}}}
decode: {{nodes: [me], port: {free_port()}, flags: {{decode-step-ms: 10, max-num-seqs: 256}}}}
proxy: {{node: me, port: {free_port()}}}
""")
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--num-prompts", type=int, default=800)
    parser.add_argument("--concurrency", type=int, default=64)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="sampling-cost-") as tmp:
        folder = Path(tmp)
        env = {**os.environ, "UCMCTL_HOME": str(folder / "home"), "UCMCTL_HISTORY": str(folder / "h.sqlite")}

        def ucmctl(*argv: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run([sys.executable, "-m", "ucmctl", *argv], capture_output=True, text=True,
                                  env=env, cwd=ROOT, timeout=1800)  # fmt: skip

        up = ucmctl("up", str(topology(folder)))
        if up.returncode != 0:
            sys.exit(f"up failed:\n{up.stderr}")
        try:
            figures: dict[str, list[float]] = {"0": [], "1": [], "0.1": []}
            samples: dict[str, int] = {}
            for r in range(args.rounds):
                for interval in figures:
                    save = folder / f"r{r}-{interval}.json"
                    run = ucmctl(*BENCH, "--num-prompts", str(args.num_prompts), "--concurrency",
                                 str(args.concurrency), "--sample-interval", interval, "--seed", str(r),
                                 "--save", str(save))  # fmt: skip
                    if run.returncode != 0:
                        sys.exit(f"bench failed:\n{run.stderr}")
                    (cell,) = json.loads(save.read_text())["cells"]
                    figures[interval].append(cell["measure"]["output_throughput"])
                    samples[interval] = len((cell["measure"].get("series") or {}).get("t") or [])
                print(f"round {r + 1}: " + ", ".join(f"{k} s: {v[-1]:.0f} tok/s" for k, v in figures.items()),
                      flush=True)  # fmt: skip
        finally:
            ucmctl("down", "sampling-cost")
    ref = statistics.median(figures["0"])
    print(f"\n{'--sample-interval':18} {'reads':>6} {'tok/s (median)':>15} {'x none':>7}")
    for interval, values in figures.items():
        m = statistics.median(values)
        name = f"{interval} s" if interval != "0" else "none (0)"
        print(f"{name:18} {samples[interval]:6d} {m:15.1f} {m / ref:7.3f}")
    cost = 1 - statistics.median(figures["1"]) / ref
    print(f"sampling every second costs {100 * cost:.1f}% of the throughput: target <= {100 * TARGET:.0f}% "
          f"{'met' if cost <= TARGET else 'NOT met'}")  # fmt: skip


if __name__ == "__main__":
    main()
