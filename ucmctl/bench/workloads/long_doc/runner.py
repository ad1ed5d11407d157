"""The long-document workload (LMCache's long-doc-qa, vLLM's long-document QA benchmark).

D documents of L tokens. The warm-up round sends each document once (one output token: it only
fills the caches); the query round sends them again `repeat_count` times each, ordered by the
repeat mode: `tile` 1 2 3 1 2 3, `interleave` 1 1 2 2 3 3, `random` the tiled list shuffled
(seeded). At most `concurrency` requests are in flight. When the documents together outgrow a
cache, `tile` evicts each one before it comes back (LRU), `interleave` finds it still there.
"""

from __future__ import annotations

import asyncio
import hashlib
from array import array
from typing import TYPE_CHECKING

from ucmctl.bench import client, prompts
from ucmctl.bench.results import Cell
from ucmctl.bench.reuse import ReuseTracker
from ucmctl.bench.runner import BenchConfig, NoProgress, Progress, Target, measure

if TYPE_CHECKING:
    from ucmctl.bench.workloads.long_doc.spec import LongDocSpec


async def run_long_doc(
    cfg: BenchConfig, spec: LongDocSpec, target: Target, progress: Progress | None = None
) -> list[Cell]:
    """One cell: the warm-up round as its first phase, the query round measured."""
    progress = progress or NoProgress()
    stream = cfg.stream_base
    docs = [
        prompts.prompt_ids(cfg.seed, i, spec.doc_tokens, cfg.vocab, stream) for i in range(spec.documents)
    ]
    order = spec.order(cfg.seed)
    ideal = ReuseTracker(cfg.block_size)
    warm_reuse = 0
    for doc in docs:
        warm_reuse += ideal.reusable(doc)
        ideal.add(doc)
    query_reuse = sum(ideal.reusable(docs[i]) for i in order)
    digest = hashlib.sha256()
    for doc in docs:
        digest.update(array("q", doc).tobytes())
    digest.update(array("q", order).tobytes())

    def body(i: int, max_tokens: int) -> bytes:
        return client.make_body(
            docs[i], max_tokens, cfg.model, cfg.ignore_eos, cfg.temperature, cache_salt=cfg.cache_salt
        )

    async with client.session(cfg.concurrency, cfg.timeout_s) as http:
        warm = await measure(
            http,
            cfg,
            target,
            "warm-up",
            [body(i, 1) for i in range(spec.documents)],
            [spec.doc_tokens] * spec.documents,
            progress,
        )
        warm.input_len, warm.output_len = spec.doc_tokens, 1
        if cfg.settle_s > 0:
            await asyncio.sleep(cfg.settle_s)
        query = await measure(
            http,
            cfg,
            target,
            "query",
            lambda k: body(order[k], cfg.output_len),
            [spec.doc_tokens] * len(order),
            progress,
        )
        query.input_len, query.output_len = spec.doc_tokens, cfg.output_len
    total = spec.doc_tokens * len(order)
    return [
        Cell(
            workload=spec.kind,
            label=f"{spec.documents}x{spec.doc_tokens} {spec.repeat_mode}",
            input_len=spec.doc_tokens,
            repeat=0,
            stream=stream,
            preseed=warm,
            measure=query,
            ideal_hit_rate=query_reuse / total if total else None,
            ideal_reused_tokens=query_reuse,
            ideal_total_tokens=total,
            warmup_ideal_hit_rate=warm_reuse / (spec.doc_tokens * spec.documents),
            prompts_digest=digest.hexdigest()[:16],
            primary=True,
        )
    ]
