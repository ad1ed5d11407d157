"""`ucmctl bench` against `vllm bench serve` on the same workload and the same real server
(issue 8 target: TTFT and TPOT means within 10 %).

    python benchmarks/harness_accuracy.py [--rounds 5] [--size medium|tiny] [--output-len 32]

One `vllm serve` on the CPU (the random-weight model of `ucmctl model make-tiny --size`),
prefix caching off; rounds alternate the two tools so background load falls on both alike;
prints the medians over rounds and their ratio. On the tiny model a decode step takes a few
milliseconds, so scheduling noise of a millisecond is a large part of TPOT; the medium model's
steps are several times longer.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.support.bench_vs_vllm import CONCURRENCY, INPUT, OUTPUT, PROMPTS, ours, theirs
from tests.support.vllm_server import VllmServer
from ucmctl.tinymodel import make_model


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--size", choices=["tiny", "medium"], default="medium")
    ap.add_argument("--output-len", type=int, default=OUTPUT)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="ucm-accuracy-") as tmp_name:
        tmp = Path(tmp_name)
        model = make_model(tmp / args.size, size=args.size, seed=0)
        extra = ["--no-enable-prefix-caching", "--max-num-seqs", str(CONCURRENCY)]  # as the e2e test
        srv = VllmServer(model, tmp / "vllm.log", tmp / "cache", dtype="bfloat16", max_model_len=2048,
                         extra_args=extra)  # fmt: skip
        try:
            srv.start().wait_ready(600)
            ours(srv, seed=1, output_len=args.output_len)  # warm-up
            mine, ref = [], []
            for r in range(args.rounds):
                mine.append(ours(srv, seed=10 + r, output_len=args.output_len))
                ref.append(theirs(srv, seed=20 + r, out=tmp, output_len=args.output_len))
        finally:
            srv.stop()
    print(f"model {args.size}; workload: {PROMPTS} prompts of {INPUT} tokens, {args.output_len} out, "
          f"concurrency {CONCURRENCY}; medians over {args.rounds} rounds")  # fmt: skip
    for key in ("mean_ttft_ms", "mean_tpot_ms", "mean_e2el_ms"):
        a = statistics.median(m[key] for m in mine)
        b = statistics.median(v[key] for v in ref)
        print(f"{key:<14} ucmctl {a:9.2f}  vllm bench serve {b:9.2f}  ratio {a / b:.3f}")


if __name__ == "__main__":
    main()
