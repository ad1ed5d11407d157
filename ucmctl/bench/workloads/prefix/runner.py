"""The prefix workload's runner, the guides' procedure for one target: per input length,
preseed, optionally reset the local caches, then measure; with the measured hit rate of each
phase from the instances' counters."""

from __future__ import annotations

import asyncio
import hashlib
from array import array
from collections.abc import Callable
from typing import Any

import aiohttp

from ucmctl.bench import client, hitrate, prompts
from ucmctl.bench.runner import BenchConfig, NoProgress, Progress, Target, detect_model, measure


async def _phase(
    http: aiohttp.ClientSession,
    cfg: BenchConfig,
    target: Target,
    label: str,
    length: int,
    max_tokens: int,
    stream: int,
    progress: Progress,
) -> dict[str, Any]:
    """One phase of the prefix workload: N prompts, each the first `length` tokens of its stream."""
    digest = hashlib.sha256()
    bodies = []
    for i in range(cfg.num_prompts):
        ids = prompts.prompt_ids(cfg.seed, i, length, cfg.vocab, stream)
        digest.update(array("q", ids).tobytes())
        bodies.append(
            client.make_body(
                ids, max_tokens, cfg.model, cfg.ignore_eos, cfg.temperature, cache_salt=cfg.cache_salt
            )
        )
    summary = await measure(http, cfg, target, label, bodies, [length] * cfg.num_prompts, progress)
    summary.update(
        {"input_len": length, "output_len": max_tokens, "_prompts_digest": digest.hexdigest()[:16]}
    )
    return summary


async def run_bench(
    cfg: BenchConfig,
    target: Target,
    progress: Progress | None = None,
    log: Callable[[str], None] = lambda _: None,
) -> list[dict[str, Any]]:
    """Every (input length, repeat) cell: {"input_len", "repeat", "seed", "preseed", "measure"}."""
    progress = progress or NoProgress()
    cells: list[dict[str, Any]] = []
    async with client.session(cfg.concurrency, cfg.timeout_s) as http:
        if cfg.model is None:
            cfg.model = await detect_model(http, target.url)
        for repeat in range(cfg.repeats):
            for k, input_len in enumerate(cfg.input_lens):
                stream = cfg.stream_base + repeat * len(cfg.input_lens) + k
                pre_len = prompts.preseed_len(input_len, cfg.prefix_ratio)
                cell: dict[str, Any] = {
                    "input_len": input_len,
                    "repeat": repeat,
                    "stream": stream,
                    "prefix_ratio": cfg.prefix_ratio,
                    "preseed": None,
                }
                tag = f"{input_len} tokens" + (
                    f", repeat {repeat + 1}/{cfg.repeats}" if cfg.repeats > 1 else ""
                )
                if pre_len > 0:
                    cell["preseed"] = await _phase(
                        http, cfg, target, f"preseed {tag}", pre_len, 1, stream, progress
                    )
                    if cfg.reset_hbm:
                        await hitrate.reset_local_caches(http, target.instances)
                        log(f"reset the local prefix cache of {len(target.instances)} instance(s)")
                    if cfg.settle_s > 0:
                        await asyncio.sleep(cfg.settle_s)
                cell["measure"] = await _phase(
                    http, cfg, target, f"measure {tag}", input_len, cfg.output_len, stream, progress
                )
                cell["prompts_digest"] = cell["measure"]["_prompts_digest"]  # preseeds are their prefixes
                cells.append(cell)
    return cells
