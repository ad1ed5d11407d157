"""One workload measured by `ucmctl bench` (`ours`) and by `vllm bench serve` (`theirs`) against the
same server: the e2e comparison test and benchmarks/harness_accuracy.py both run it."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.support.vllm_server import VllmServer
from ucmctl.bench.hitrate import Instance
from ucmctl.bench.prompts import vocab_from_model
from ucmctl.bench.runner import BenchConfig, Target
from ucmctl.bench.workloads import PrefixSpec
from ucmctl.bench.workloads.prefix.runner import run_bench

INPUT, OUTPUT, PROMPTS, CONCURRENCY = 512, 32, 16, 4
VENV_BIN = Path(sys.executable).parent


def ours(srv: VllmServer, seed: int, output_len: int = OUTPUT) -> dict[str, float]:
    spec = PrefixSpec(input_lens=[INPUT], prefix_ratio=0.0, num_prompts=PROMPTS)
    cfg = BenchConfig(
        concurrency=CONCURRENCY,
        output_len=output_len,
        seed=seed,
        vocab=vocab_from_model(srv.model),
        model="m",
        temperature=0.0,
    )
    (cell,) = asyncio.run(run_bench(cfg, spec, Target(srv.url, [Instance("vllm", "mixed", srv.url)])))
    assert cell.measure is not None
    return cell.measure.document()


def vllm_bench_serve(
    url: str,
    model: str,
    tokenizer: str,
    *,
    input_len: int,
    output_len: int,
    prompts: int,
    concurrency: int,
    seed: int,
    out: Path,
    extra: tuple[str, ...] = (),
) -> dict[str, Any]:
    """Run `vllm bench serve` (random dataset, --ignore-eos) once; its saved result."""
    name = f"vllm-{seed}.json"
    cmd = [str(VENV_BIN / "vllm"), "bench", "serve", "--backend", "vllm", "--base-url", url,
           "--model", model, "--tokenizer", tokenizer, "--dataset-name", "random",
           "--random-input-len", str(input_len), "--random-output-len", str(output_len),
           "--num-prompts", str(prompts), "--max-concurrency", str(concurrency), "--ignore-eos",
           "--seed", str(seed), "--disable-tqdm", *extra,
           "--save-result", "--result-dir", str(out), "--result-filename", name]  # fmt: skip
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "VLLM_TARGET_DEVICE": "cpu"}
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    result: dict[str, Any] = json.loads((out / name).read_text())
    return result


def theirs(srv: VllmServer, seed: int, out: Path, output_len: int = OUTPUT) -> dict[str, float]:
    return vllm_bench_serve(
        srv.url, "m", str(srv.model), input_len=INPUT, output_len=output_len, prompts=PROMPTS,
        concurrency=CONCURRENCY, seed=seed, out=out,
        extra=("--temperature", "0", "--percentile-metrics", "ttft,tpot,itl,e2el"),
    )  # fmt: skip
