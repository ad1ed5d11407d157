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
import random
from array import array
from dataclasses import dataclass
from typing import Any, Literal

from ucmctl.bench import client, prompts
from ucmctl.bench.reuse import ReuseTracker
from ucmctl.bench.runner import BenchConfig, NoProgress, Progress, Target, measure
from ucmctl.core.errors import UcmctlError

NAME = "long-doc"
RepeatMode = Literal["random", "tile", "interleave"]
REPEAT_MODES: tuple[str, ...] = ("random", "tile", "interleave")


@dataclass
class LongDoc:
    documents: int = 8
    doc_tokens: int = 8192
    repeat_count: int = 2
    repeat_mode: str = "random"

    def check(self, output_len: int, max_model_len: int | None) -> None:
        for key, value in (
            ("--documents", self.documents),
            ("--doc-tokens", self.doc_tokens),
            ("--repeat-count", self.repeat_count),
        ):
            if value < 1:
                raise UcmctlError.one(f"{value} is not a positive count", key=key)
        if self.repeat_mode not in REPEAT_MODES:
            raise UcmctlError.one(
                f"unknown repeat mode '{self.repeat_mode}'",
                key="--repeat-mode",
                fix=f"use one of {', '.join(REPEAT_MODES)}",
            )
        if max_model_len is not None and self.doc_tokens + output_len > max_model_len:
            raise UcmctlError.one(
                f"a document of {self.doc_tokens} tokens and {output_len} output tokens exceed the "
                f"server's max_model_len {max_model_len}",
                key="--doc-tokens",
            )

    def order(self, seed: int) -> list[int]:
        """The query round's documents, in the order they are sent."""
        d, n = self.documents, self.repeat_count
        if self.repeat_mode == "interleave":
            return [i for i in range(d) for _ in range(n)]
        tiled = [i for _ in range(n) for i in range(d)]
        if self.repeat_mode == "random":
            random.Random(seed).shuffle(tiled)
        return tiled

    def in_flight_tokens(self, concurrency: int, output_len: int) -> int:
        return min(concurrency, self.documents * self.repeat_count) * (self.doc_tokens + output_len)


async def run_long_doc(
    cfg: BenchConfig, spec: LongDoc, target: Target, progress: Progress | None = None
) -> list[dict[str, Any]]:
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
        return client.make_body(docs[i], max_tokens, cfg.model, cfg.ignore_eos, cfg.temperature)

    async with client.session(cfg.concurrency, cfg.timeout_s) as http:
        warm = await measure(
            http, cfg, target, "warm-up", [body(i, 1) for i in range(spec.documents)],
            [spec.doc_tokens] * spec.documents, progress,
        )  # fmt: skip
        warm.update({"input_len": spec.doc_tokens, "output_len": 1})
        if cfg.settle_s > 0:
            await asyncio.sleep(cfg.settle_s)
        query = await measure(
            http, cfg, target, "query", lambda k: body(order[k], cfg.output_len),
            [spec.doc_tokens] * len(order), progress,
        )  # fmt: skip
        query.update({"input_len": spec.doc_tokens, "output_len": cfg.output_len})
    total = spec.doc_tokens * len(order)
    return [
        {
            "workload": NAME,
            "label": f"{spec.documents}x{spec.doc_tokens} {spec.repeat_mode}",
            "input_len": spec.doc_tokens,
            "repeat": 0,
            "stream": stream,
            "preseed": warm,
            "measure": query,
            "ideal_hit_rate": query_reuse / total if total else None,
            "ideal_reused_tokens": query_reuse,
            "ideal_total_tokens": total,
            "warmup_ideal_hit_rate": warm_reuse / (spec.doc_tokens * spec.documents),
            "prompts_digest": digest.hexdigest()[:16],
            "primary": True,
        }
    ]
