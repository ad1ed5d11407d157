"""Harness capacity: can `ucmctl bench` consume streamed tokens at least as fast as
`vllm bench serve`? (issue 8 target: ratio >= 1.0). Both load one zero-cost simulator with the
same workload (N streams at once, short prompts, long outputs, --ignore-eos), alternating
rounds; each reports its own output-token throughput (first send to last answer).

    python benchmarks/harness_capacity.py [--streams 64] [--tokens 1000] [--rounds 3]

The reference, `vllm bench serve`, is measured in the same run on the same server.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.support.bench_vs_vllm import vllm_bench_serve
from tests.support.processes import sim_server
from ucmctl.bench.hitrate import Instance
from ucmctl.bench.prompts import vocab_from_model
from ucmctl.bench.runner import BenchConfig, Target
from ucmctl.bench.workloads import PrefixSpec
from ucmctl.bench.workloads.prefix.runner import run_bench


def ours(url: str, model: str, streams: int, tokens: int, input_len: int, seed: int) -> tuple[float, int]:
    spec = PrefixSpec(input_lens=[input_len], prefix_ratio=0.0, num_prompts=streams)
    cfg = BenchConfig(
        concurrency=streams,
        output_len=tokens,
        seed=seed,
        vocab=vocab_from_model(Path(model)),
        model=model,
    )
    (cell,) = asyncio.run(run_bench(cfg, spec, Target(url, [Instance("sim", "mixed", url)])))
    m = cell.measure
    return float(m.output_throughput or 0), m.failed


def theirs(
    url: str, model: str, streams: int, tokens: int, input_len: int, seed: int, out: Path
) -> tuple[float, int]:
    result = vllm_bench_serve(url, model, model, input_len=input_len, output_len=tokens, prompts=streams,
                              concurrency=streams, seed=seed, out=out)  # fmt: skip
    return float(result["output_throughput"]), int(result.get("failed", 0))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--streams", type=int, default=64)
    ap.add_argument("--tokens", type=int, default=1000)
    ap.add_argument("--input-len", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument(
        "--model-dir", type=Path, default=None, help="tokenizer folder (default: a tiny one built)"
    )
    args = ap.parse_args()

    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        model_dir = args.model_dir
        if model_dir is None:
            from ucmctl.tinymodel import make_model

            model_dir = make_model(tmp / "tiny", size="tiny", seed=0)
        model = str(model_dir)
        flags = ("--profile", "zero", "--max-num-seqs", str(args.streams), "--no-enable-prefix-caching")
        with sim_server(tmp, *flags, model=model, timeout=60) as srv:
            mine, ref = [], []
            for r in range(args.rounds):
                a, fa = ours(srv.url, model, args.streams, args.tokens, args.input_len, seed=100 + r)
                b, fb = theirs(srv.url, model, args.streams, args.tokens, args.input_len, 200 + r, tmp)
                mine.append(a)
                ref.append(b)
                print(
                    f"round {r + 1}: ucmctl bench {a:,.0f} tok/s ({fa} failed), "
                    f"vllm bench serve {b:,.0f} tok/s ({fb} failed)"
                )
    ratio = statistics.median(mine) / statistics.median(ref)
    print(f"{args.streams} streams x {args.tokens} tokens, zero-cost simulator, {args.rounds} rounds")
    print(
        f"median streamed tokens/s: ucmctl bench {statistics.median(mine):,.0f}, "
        f"vllm bench serve {statistics.median(ref):,.0f} -> ratio {ratio:.2f} (target >= 1.0)"
    )


if __name__ == "__main__":
    main()
