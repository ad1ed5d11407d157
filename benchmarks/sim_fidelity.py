"""How close the simulator is to real vLLM on the CPU (target: TTFT and TPOT within 25 %).

    python benchmarks/sim_fidelity.py [--model .models/medium]
        [--calibrate ucmctl/sim/profiles/medium-cpu.json]

One run: start real `vllm serve` on the medium model, optionally fit a profile to it
(`ucmctl sim calibrate`), then send the connector benchmark's workload (4,096-token prompts,
prefix ratio 0.8: a miss, then a local prefix hit after a preseed; and a 64-token decode) to the
real server and to `ucmctl sim serve` with the profile, and print both with their ratio.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from tests.support.processes import sim_server
from tests.support.vllm_server import VllmServer
from ucmctl.sim.calibrate import calibrate, kv_bytes_from_model

SHORT = 64  # tokens: a short prompt's TTFT (a decode leg's first step, a turn's new part)
BESIDE = 320  # tokens: a prompt computed beside 4 decoding streams (a multi-turn round's new part)
KEYS = ("ttft_miss_ms", "ttft_hit_ms", "tpot_ms", "ttft_short_ms", "ttft_beside_ms", "stall_beside_ms")


async def stream(url: str, prompt: list[int], max_tokens: int) -> list[float]:
    body = {"model": "m", "prompt": prompt, "max_tokens": max_tokens, "stream": True, "ignore_eos": True,
            "temperature": 0}  # fmt: skip
    times = []
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as s:
        start = time.perf_counter()
        async with s.post(f"{url}/v1/completions", json=body) as r:
            r.raise_for_status()
            async for line in r.content:
                if line.startswith(b"data: {") and b'"text"' in line:
                    times.append(time.perf_counter() - start)
    return times


async def beside(url: str, rng: random.Random, vocab: int, streams: int, prompt: int) -> tuple[float, float]:
    """`streams` answers decoding, then a fresh prompt of `prompt` tokens sent beside them: (its
    TTFT, the longest gap between two tokens of a stream, median over the streams). What a
    decode instance's streams pay for a prompt it computes itself (selective disaggregation)."""

    async def later() -> list[float]:
        await asyncio.sleep(0.8)  # the streams past their first tokens
        return await stream(url, [rng.randrange(10, vocab) for _ in range(prompt)], 1)

    runs = await asyncio.gather(
        *(stream(url, [rng.randrange(10, vocab) for _ in range(32)], 96) for _ in range(streams)), later()
    )
    gaps = [max(b - a for a, b in itertools.pairwise(t[4:])) for t in runs[:-1]]
    return runs[-1][0], statistics.median(gaps)


def workload(url: str, length: int, ratio: float, repeats: int, vocab: int, seed: int) -> dict[str, float]:
    rng = random.Random(seed)
    miss, hit, tpot, short, ttft_beside, stall = [], [], [], [], [], []
    for _ in range(repeats):
        short.append(asyncio.run(stream(url, [rng.randrange(10, vocab) for _ in range(SHORT)], 1))[0])
        first, gap = asyncio.run(beside(url, rng, vocab, 4, BESIDE))
        ttft_beside.append(first)
        stall.append(gap)
        prompt = [rng.randrange(10, vocab) for _ in range(length)]
        miss.append(asyncio.run(stream(url, prompt, 1))[0])
        prompt = [rng.randrange(10, vocab) for _ in range(length)]
        asyncio.run(stream(url, prompt[: int(length * ratio)], 1))  # preseed the prefix
        hit.append(asyncio.run(stream(url, prompt, 1))[0])
        t = asyncio.run(stream(url, [rng.randrange(10, vocab) for _ in range(64)], 65))
        tpot.append((t[-1] - t[0]) / (len(t) - 1))
    return {"ttft_miss_ms": 1000 * statistics.median(miss), "ttft_hit_ms": 1000 * statistics.median(hit),
            "tpot_ms": 1000 * statistics.median(tpot), "ttft_short_ms": 1000 * statistics.median(short),
            "ttft_beside_ms": 1000 * statistics.median(ttft_beside),
            "stall_beside_ms": 1000 * statistics.median(stall)}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", type=Path, default=ROOT / ".models" / "medium")
    ap.add_argument("--calibrate", type=Path, help="fit a profile to the real server and write it here")
    ap.add_argument("--profile", default="medium-cpu")
    ap.add_argument("--length", type=int, default=4096)
    ap.add_argument("--ratio", type=float, default=0.8)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    from tokenizers import Tokenizer

    # Servers refuse ids their tokenizer does not know; the config may declare more.
    vocab = min(json.loads((args.model / "config.json").read_text())["vocab_size"],
                Tokenizer.from_file(str(args.model / "tokenizer.json")).get_vocab_size())  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="ucm-fidelity-") as tmp:
        server = VllmServer(model=args.model, log_path=Path(tmp) / "vllm.log", cache_root=Path(tmp) / "cache",
                            extra_args=["--block-size", "128"])  # fmt: skip
        try:
            server.start().wait_ready(600)
            asyncio.run(stream(server.url, [11] * 512, 4))  # warm-up: the first long request is slow
            profile = args.profile
            if args.calibrate:
                kv = kv_bytes_from_model(args.model)
                calibrate(server.url, args.calibrate, lengths=[64, 256, 512, 1024, 2048, 4096],
                          batches=[1, 4, 8], vocab=vocab, kv_bytes_per_token=kv,
                          name="medium-cpu")  # fmt: skip
                profile = str(args.calibrate)
            real = workload(server.url, args.length, args.ratio, args.repeats, vocab, seed=1)
        finally:
            server.stop()
        with sim_server(Path(tmp), "--profile", profile, "--block-size", "128", "--max-model-len", "8192",
                        "--served-model-name", "m",
                        model=str(args.model)) as sim:  # fmt: skip
            simulated = workload(sim.url, args.length, args.ratio, args.repeats, vocab, seed=1)
    print(f"workload: {args.length}-token prompts, prefix ratio {args.ratio}, 64-token decode; "
          f"median of {args.repeats}; profile {profile}")  # fmt: skip
    print(f"{'metric':<14}{'real vLLM':>12}{'sim':>12}{'sim/real':>10}")
    for key in KEYS:
        print(f"{key:<14}{real[key]:>12.1f}{simulated[key]:>12.1f}{simulated[key] / real[key]:>10.2f}")


if __name__ == "__main__":
    main()
