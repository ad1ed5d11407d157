"""The prefix workload's runner, the guides' procedure for one target: per input length,
preseed, optionally reset the local caches, then measure; with the measured hit rate of each
phase from the instances' counters."""

from __future__ import annotations

import asyncio
import hashlib
from array import array
from collections.abc import Callable
from typing import TYPE_CHECKING

import aiohttp

from ucmctl.bench import client, hitrate, prompts
from ucmctl.bench.results import Cell, Phase
from ucmctl.bench.runner import BenchConfig, NoProgress, Progress, Target, detect_model, measure

if TYPE_CHECKING:
    from ucmctl.bench.workloads.prefix.spec import PrefixSpec


async def _phase(
    http: aiohttp.ClientSession,
    cfg: BenchConfig,
    prompts_per_phase: int,
    target: Target,
    label: str,
    length: int,
    max_tokens: int,
    stream: int,
    progress: Progress,
) -> tuple[Phase, str]:
    """One phase of the prefix workload: N prompts, each the first `length` tokens of its stream;
    with the digest of its prompts."""
    digest = hashlib.sha256()
    bodies = []
    for i in range(prompts_per_phase):
        ids = prompts.prompt_ids(cfg.seed, i, length, cfg.vocab, stream)
        digest.update(array("q", ids).tobytes())
        bodies.append(
            client.make_body(
                ids, max_tokens, cfg.model, cfg.ignore_eos, cfg.temperature, cache_salt=cfg.cache_salt
            )
        )
    phase = await measure(http, cfg, target, label, bodies, [length] * prompts_per_phase, progress)
    phase.input_len, phase.output_len = length, max_tokens
    return phase, digest.hexdigest()[:16]


async def run_bench(
    cfg: BenchConfig,
    spec: PrefixSpec,
    target: Target,
    progress: Progress | None = None,
    log: Callable[[str], None] = lambda _: None,
) -> list[Cell]:
    """Every (input length, repeat) cell: its input length, repeat, stream, prefix ratio, preseed
    and measure phases, and the digest of its prompts (the preseeds' are their prefixes)."""
    progress = progress or NoProgress()
    n = spec.num_prompts
    cells: list[Cell] = []
    async with client.session(cfg.concurrency, cfg.timeout_s) as http:
        if cfg.model is None:
            cfg.model = await detect_model(http, target.url)
        for repeat in range(spec.repeats):
            for k, input_len in enumerate(spec.input_lens):
                stream = cfg.stream_base + repeat * len(spec.input_lens) + k
                pre_len = prompts.preseed_len(input_len, spec.prefix_ratio)
                tag = f"{input_len} tokens" + (
                    f", repeat {repeat + 1}/{spec.repeats}" if spec.repeats > 1 else ""
                )
                preseed = None
                if pre_len > 0:
                    label = f"preseed {tag}"
                    preseed, _ = await _phase(http, cfg, n, target, label, pre_len, 1, stream, progress)
                    if spec.reset_hbm:
                        await hitrate.reset_local_caches(http, target.instances)
                        log(f"reset the local prefix cache of {len(target.instances)} instance(s)")
                    if cfg.settle_s > 0:
                        await asyncio.sleep(cfg.settle_s)
                label = f"measure {tag}"
                measured, digest = await _phase(
                    http, cfg, n, target, label, input_len, cfg.output_len, stream, progress
                )
                cells.append(
                    Cell(
                        input_len=input_len,
                        repeat=repeat,
                        stream=stream,
                        prefix_ratio=spec.prefix_ratio,
                        preseed=preseed,
                        measure=measured,
                        prompts_digest=digest,
                    )
                )
    return cells
