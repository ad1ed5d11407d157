"""Fit a simulator Profile to a real vLLM server: prefill cost by prompt length, decode step by
batch size and context. Every measurement is a real request; the fit is least squares.

A busy machine only ever adds time to a request, never takes it away, so a prompt length's cost
is the fastest of its repeats: one run slowed by a neighbour does not move the fit."""

from __future__ import annotations

import asyncio
import itertools
import json
import random
import statistics
import time
from datetime import date
from pathlib import Path

import aiohttp
import numpy as np

from ucmctl.sim.profile import Profile


async def _stream(
    session: aiohttp.ClientSession, url: str, model: str, prompt: list[int], max_tokens: int
) -> list[float]:
    """Arrival times (seconds after sending) of every streamed chunk that carries text."""
    body = {
        "model": model,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "stream": True,
        "ignore_eos": True,
        "temperature": 0,
    }
    start = time.perf_counter()
    times: list[float] = []
    async with session.post(f"{url}/v1/completions", json=body) as r:
        r.raise_for_status()
        async for line in r.content:
            if line.startswith(b"data: {") and b'"choices":[{' in line.replace(b" ", b""):
                times.append(time.perf_counter() - start)
    if not times:
        raise RuntimeError(f"{url} streamed no tokens")
    return times


def _prompt(rng: random.Random, n: int, vocab: int) -> list[int]:
    return [rng.randrange(10, vocab) for _ in range(n)]


async def measure(
    url: str, lengths: list[int], batches: list[int], vocab: int, seed: int = 0, repeats: int = 3
) -> dict[str, list[tuple[float, float]]]:
    """Raw points: prefill (tokens, ms), decode (batch, ms per step), context (tokens, ms)."""
    rng = random.Random(seed)
    timeout = aiohttp.ClientTimeout(total=1800)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        async with session.get(f"{url}/v1/models") as r:
            model = (await r.json())["data"][0]["id"]
        await _stream(session, url, model, _prompt(rng, 512, vocab), 4)  # warm-up
        prefill = []
        for n in lengths:
            for _ in range(repeats):  # fresh tokens every time: no prefix hit
                t = await _stream(session, url, model, _prompt(rng, n, vocab), 1)
                prefill.append((float(n), t[0] * 1000))
        decode = []
        for b in batches:
            runs = await asyncio.gather(
                *(_stream(session, url, model, _prompt(rng, 32, vocab), 48) for _ in range(b))
            )
            gaps = [later - earlier for t in runs for earlier, later in itertools.pairwise(t[8:])]
            decode.append((float(b), statistics.median(gaps) * 1000))
        context = []
        for n in (32, max(lengths) // 2):
            t = await _stream(session, url, model, _prompt(rng, n, vocab), 48)
            gaps = [b - a for a, b in itertools.pairwise(t[8:])]
            context.append((float(n), statistics.median(gaps) * 1000))
    return {"prefill": prefill, "decode": decode, "context": context, "model": [(0.0, 0.0)], "name": model}  # type: ignore[dict-item]


def fit(points: dict[str, list[tuple[float, float]]], kv_bytes_per_token: int, source: str) -> Profile:
    fastest: dict[float, float] = {}
    for tokens, took in points["prefill"]:
        fastest[tokens] = min(took, fastest.get(tokens, took))
    n, t = (np.array(v) for v in zip(*fastest.items(), strict=True))
    design = np.stack([np.ones_like(n), n, n * n], axis=1)
    (base, a, b), *_ = np.linalg.lstsq(design, t, rcond=None)
    bs, ms = (np.array(v) for v in zip(*points["decode"], strict=True))
    (step, per_seq), *_ = np.linalg.lstsq(np.stack([np.ones_like(bs), bs], axis=1), ms, rcond=None)
    (c0, m0), (c1, m1) = points["context"]
    return Profile(
        name="calibrated",
        base_ms=max(0.0, float(base)),
        prefill_us_per_token=max(0.0, float(a) * 1000),
        prefill_attn_ns=max(0.0, float(b) * 2e6),  # prefill_ms(n, 0) = n*us/1e3 + ns*n^2/2e6
        decode_step_ms=max(0.0, float(step)),
        decode_seq_us=max(0.0, float(per_seq) * 1000),
        decode_ctx_ns=max(0.0, (m1 - m0) / (c1 - c0) * 1e6) if c1 > c0 else 0.0,
        kv_bytes_per_token=kv_bytes_per_token,
        source=source,
    )


def kv_bytes_from_model(model_dir: Path, dtype_bytes: int = 2) -> int:
    """KV bytes per token of a Llama-shaped config.json: layers x (K and V) x kv_heads x head_dim."""
    cfg = json.loads((model_dir / "config.json").read_text())
    heads = cfg["num_attention_heads"]
    kv_heads = cfg.get("num_key_value_heads", heads)
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // heads
    return int(cfg["num_hidden_layers"] * 2 * kv_heads * head_dim * dtype_bytes)


def calibrate(
    url: str,
    out: Path,
    *,
    lengths: list[int],
    batches: list[int],
    vocab: int,
    kv_bytes_per_token: int,
    name: str,
) -> Profile:
    points = asyncio.run(measure(url.rstrip("/"), lengths, batches, vocab))
    source = (
        f"ucmctl sim calibrate against {points['name']} on {date.today().isoformat()}: "
        f"prefill lengths {lengths}, decode batches {batches}"
    )
    profile = fit(points, kv_bytes_per_token, source).model_copy(update={"name": name})
    out.write_text(
        json.dumps(
            {
                **profile.model_dump(),
                "points": {k: v for k, v in points.items() if k in ("prefill", "decode", "context")},
            },
            indent=2,
        )
        + "\n"
    )
    return profile
