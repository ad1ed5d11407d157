"""A step scheduler with vLLM's shape: running decodes first, then chunked prefill in budget.

Each step's compute time comes from the Profile and is slept on a fixed schedule (deadlines,
not sleeps after work), so the engine's own overhead does not stretch simulated time. Loads
from and saves to the external tier are real I/O and add their real cost to the step.

KV blocks are accounted as vLLM's KV cache manager does, in a simpler form: the engine has
`num_blocks` blocks (vLLM's num_gpu_blocks, the prefix cache's capacity). A running request
holds ceil(context / block_size) of them (its prompt from admission on, then one more block
each time a decode step crosses a block boundary); the prefix cache keeps what the running
requests leave free (cached-but-free blocks are evicted first, least recent first). A waiting
request is admitted only when the blocks of its whole prompt are free; when a running
request needs a block and none is free, the most recently admitted running request is
preempted (vLLM v1, FCFS: `preempted_req = self.running.pop()`): its blocks are released and
it goes back to the front of the queue to recompute its prompt and the tokens it already
generated (those are not sent again). A request alone in the engine is never preempted: it
may overcommit (vLLM refuses to start when max_model_len does not fit; the server rejects
such requests up front).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
import zlib
from array import array
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ucmctl.core.histogram import Histogram
from ucmctl.sim.external import ExternalTier
from ucmctl.sim.metrics import inter_token_buckets, request_latency_buckets, ttft_buckets
from ucmctl.sim.prefix_cache import PrefixCache, extend_keys
from ucmctl.sim.profile import Profile

FINISHED = -1  # queue sentinel
WINDOW = 16  # the context tokens the next token is a function of


def next_token(context_tail: Sequence[int], vocab: int) -> int:
    """Greedy-like: the next token is a function of the context alone (its last WINDOW tokens),
    so the same prompt always goes on with the same tokens, and a request whose prompt is
    another's prompt and the first k tokens it generated goes on with that one's tokens from
    k (a stream continued elsewhere equals the uninterrupted one)."""
    return (zlib.crc32(array("q", context_tail).tobytes()) * 1103515245 + 12345) % vocab


def continuation(prompt: Sequence[int], n: int, vocab: int) -> list[int]:
    """The n tokens the engine generates after `prompt`."""
    out: list[int] = []
    for _ in range(n):
        out.append(next_token(_tail(prompt, out), vocab))
    return out


def _tail(prompt: Sequence[int], output: Sequence[int]) -> list[int]:
    """The last WINDOW tokens of `prompt` then `output`."""
    tail = list(output[-WINDOW:])
    need = WINDOW - len(tail)
    return [*prompt[-need:], *tail] if need else tail


@dataclass
class SimRequest:
    request_id: str
    prompt: list[int]
    max_tokens: int
    keys: list[bytes]  # keys of the full blocks whose KV exists: the prompt's, then the answer's
    arrival: float = field(default_factory=time.monotonic)
    remote_kv: bool = False  # P2P decode: the prompt's KV arrived from a prefill instance
    computed: int = 0  # prompt tokens whose KV exists
    local_hit_tokens: int = 0
    external_hit_tokens: int = 0
    generated: int = 0
    saved_blocks: int = 0  # prompt blocks already handed to the external tier
    pack_heads: list[int] = field(default_factory=list)  # with packs: per block, its pack's (lookup)
    cancelled: bool = False
    delivered: bool = False  # the client has every token
    admitted: bool = False
    blocks: int = 0  # KV blocks it holds while running
    recompute: int = 0  # generated tokens to prefill again after a preemption
    preemptions: int = 0
    last_emit: float = 0.0
    out: asyncio.Queue[int] = field(default_factory=asyncio.Queue)
    output: list[int] = field(default_factory=list)  # the tokens generated so far
    namespace: bytes = b""  # the keys' namespace (the server's)

    def context_tail(self) -> list[int]:
        """The last WINDOW tokens of its context (the prompt, then what it generated)."""
        return _tail(self.prompt, self.output)

    @property
    def prefill_target(self) -> int:
        """Tokens to prefill: the prompt, plus what it had generated when it was preempted."""
        return len(self.prompt) + self.recompute

    @property
    def prefill_done(self) -> bool:
        return self.computed >= self.prefill_target

    def tokens_of(self, start: int, stop: int, block_size: int) -> list[int]:
        """The tokens of blocks `start` to `stop` of the prompt and then the answer, without
        copying either whole."""
        first, last, n = start * block_size, stop * block_size, len(self.prompt)
        return self.prompt[first:last] + self.output[max(first - n, 0) : max(last - n, 0)]


@dataclass
class EngineStats:
    prefix_queries: int = 0
    prefix_hits: int = 0
    external_queries: int = 0
    external_hits: int = 0
    prompt_tokens: int = 0
    generation_tokens: int = 0
    finished: int = 0
    preemptions: int = 0
    steps: int = 0
    planned_ms: float = 0.0  # simulated compute the steps asked for
    elapsed_ms: float = 0.0  # wall time the steps took
    ttft: Histogram = field(default_factory=lambda: Histogram(ttft_buckets(), count_first=True))
    itl: Histogram = field(default_factory=lambda: Histogram(inter_token_buckets(), count_first=True))
    e2e: Histogram = field(default_factory=lambda: Histogram(request_latency_buckets(), count_first=True))


class Engine:
    """One engine core (one DP rank)."""

    def __init__(
        self,
        index: int,
        profile: Profile,
        *,
        block_size: int,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        cache: PrefixCache,
        external: ExternalTier | None,
        vocab: int,
    ) -> None:
        self.index = index
        self.profile = profile
        self.block_size = block_size
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.cache = cache
        self.external = external
        self.vocab = vocab
        self.num_blocks = cache.capacity  # vLLM's num_gpu_blocks: running requests and cache share it
        self.held_blocks = 0  # held by running requests
        self.waiting: deque[SimRequest] = deque()
        self.running: list[SimRequest] = []
        self.stats: EngineStats = EngineStats()
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        # where the prefix cache's events go (sim/kv_events.Publisher.send); None: not recorded
        self.publish: Callable[[list[dict[str, Any]]], None] | None = None

    @property
    def kv_usage(self) -> float:
        """vLLM's kv_cache_usage_perc: blocks held by running requests over all blocks."""
        return min(self.held_blocks / self.num_blocks, 1.0) if self.num_blocks else 0.0

    def blocks_for(self, tokens: int) -> int:
        return math.ceil(tokens / self.block_size)

    @property
    def load(self) -> int:
        return len(self.waiting) + len(self.running)

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._loop(), name=f"engine-{self.index}")

    async def stop(self) -> None:
        if self._task:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    def submit(self, request: SimRequest) -> None:
        self.waiting.append(request)
        self._wake.set()

    def cancel(self, request: SimRequest) -> None:
        request.cancelled = True
        self._wake.set()

    async def _loop(self) -> None:
        free_at = time.monotonic()  # when the simulated device finishes its previous step
        while True:
            self._drop_cancelled()
            if not self.waiting and not self.running:
                self._wake.clear()
                await self._wake.wait()
                free_at = time.monotonic()  # the device was idle: the schedule starts now
            started = time.monotonic()
            chunks, decoding, compute_ms = await self._schedule()  # loads happen here, for real
            load_s = time.monotonic() - started
            # Steps follow each other on an absolute schedule: the Python work between steps
            # (emitting tokens, writing them to clients) overlaps the next step's simulated
            # compute instead of stretching it; only work longer than a step makes it late.
            done = free_at + load_s + compute_ms / 1000
            delay = done - time.monotonic()
            await asyncio.sleep(max(delay, 0))
            saving = time.monotonic()
            await self._save_new_blocks(chunks, decoding)  # the connector's wait_for_save, for real
            free_at = done + (time.monotonic() - saving)
            self._advance(chunks, decoding, time.monotonic())
            self.flush_events()
            self.stats.steps += 1
            self.stats.planned_ms += compute_ms
            self.stats.elapsed_ms += (time.monotonic() - started) * 1000

    def flush_events(self) -> None:
        """Publish what the prefix cache recorded since the last time, as one batch."""
        events = self.cache.events
        if self.publish is not None and events:
            self.publish(list(events))
            events.clear()

    def _drop_cancelled(self) -> None:
        if any(r.cancelled for r in self.waiting):
            self.waiting = deque(r for r in self.waiting if not r.cancelled)
        for r in [r for r in self.running if r.cancelled]:
            self.running.remove(r)
            self._release(r)
            r.out.put_nowait(FINISHED)

    async def _schedule(self) -> tuple[list[tuple[SimRequest, int]], list[SimRequest], float]:
        """vLLM's order: running decodes, running prefills, then new requests, within the token
        budget. Returns the prefill chunks, the decoding requests and the step's compute ms."""
        budget = self.max_num_batched_tokens
        preempted = self._grow_running()
        decoding = [r for r in self.running if r.prefill_done]
        budget -= len(decoding)
        chunks: list[tuple[SimRequest, int]] = []
        for r in self.running:
            if not r.prefill_done and budget > 0:
                n = min(r.prefill_target - r.computed, budget)
                chunks.append((r, n))
                budget -= n
        # As vLLM: no new admissions in a step that had to preempt.
        while not preempted and self.waiting and len(self.running) < self.max_num_seqs and budget > 0:
            r = self.waiting[0]
            need = self.blocks_for(r.prefill_target)
            if need > self.num_blocks - self.held_blocks and self.running:
                break  # its prompt's blocks are not free: it waits (FCFS, as vLLM's scheduler)
            self.waiting.popleft()
            self._hold(r, need)
            if r.admitted:  # readmitted after a preemption: recompute everything
                r.computed = 0
            else:
                await self._admit(r)
            self.running.append(r)
            n = min(r.prefill_target - r.computed, budget)
            chunks.append((r, n))
            budget -= n
        compute_ms = sum(self.profile.prefill_ms(n, r.computed) for r, n in chunks)
        context = sum(len(r.prompt) + r.generated for r in decoding)
        compute_ms += self.profile.decode_ms(len(decoding), context)
        if chunks:  # one fixed cost a step: a step that prefills and decodes pays the larger once
            compute_ms += max(0.0, self.profile.base_ms - (self.profile.decode_step_ms if decoding else 0.0))
        return chunks, decoding, compute_ms

    def _grow_running(self) -> bool:
        """Give each running request the blocks this step writes into, preempting the most
        recently admitted ones when none are free. Whether any request was preempted."""
        preempted = False
        i = 0
        while i < len(self.running):
            r = self.running[i]
            tokens = len(r.prompt) + r.generated if r.prefill_done else r.prefill_target
            need = self.blocks_for(tokens) - r.blocks
            while need > self.num_blocks - self.held_blocks and len(self.running) > 1:
                victim = self.running.pop()  # the lowest priority: the last admitted
                self._preempt(victim)
                preempted = True
                if victim is r:
                    break
            if i == len(self.running):  # r itself was preempted: it was the last one
                break
            if need > 0:
                self._hold(r, need)  # alone in the engine it may overcommit rather than hang
            i += 1
        return preempted

    def _preempt(self, r: SimRequest) -> None:
        """vLLM's recompute preemption: free the blocks, back to the front of the queue."""
        self._release(r)
        r.recompute = r.generated
        r.computed = 0
        r.preemptions += 1
        self.stats.preemptions += 1
        self.waiting.appendleft(r)

    def _hold(self, r: SimRequest, blocks: int) -> None:
        r.blocks += blocks
        self.held_blocks += blocks
        self._fit_cache()

    def _release(self, r: SimRequest) -> None:
        self.held_blocks -= r.blocks
        r.blocks = 0
        self._fit_cache()

    def _fit_cache(self) -> None:
        """The prefix cache keeps the blocks running requests leave free: least recent go first."""
        self.cache.resize(max(self.num_blocks - self.held_blocks, 0))

    def _advance(self, chunks: list[tuple[SimRequest, int]], decoding: list[SimRequest], now: float) -> None:
        for r, n in chunks:
            if r.cancelled:
                continue
            r.computed += n
            if r.prefill_done:
                self._emit(r, now)  # the first token comes with the last prefill chunk
        for r in decoding:
            if not r.cancelled:
                self._emit(r, now)

    async def _admit(self, r: SimRequest) -> None:
        """Prefix hits when a request is first scheduled: local cache, then the external tier."""
        r.admitted = True
        total_blocks = len(r.keys)
        # As vLLM, at least the last prompt token is computed: hits stop one token short.
        usable = min(total_blocks, (len(r.prompt) - 1) // self.block_size)
        self.stats.prompt_tokens += len(r.prompt)
        if r.remote_kv:  # P2P decode: vLLM counts KV a connector delivers as external hits
            r.computed = len(r.prompt) - 1
            r.external_hit_tokens = r.computed
            self.stats.external_queries += len(r.prompt)
            self.stats.external_hits += r.computed
            return
        local = min(self.cache.match(r.keys), usable)
        self.stats.prefix_queries += len(r.prompt)
        self.stats.prefix_hits += local * self.block_size
        r.local_hit_tokens = local * self.block_size
        external = 0
        if self.external is not None and local < usable:
            wanted = r.keys[local:usable]
            looked: float | None = None
            heads: list[int] | None = []
            if self.external.pack_blocks > 1:
                looked = time.perf_counter()  # the walk and the presence check: one bound
                heads = await asyncio.to_thread(self.external.pack_heads, r.keys[:usable])
                r.pack_heads = heads or []
            packs = self.external.packs(r.keys, local, len(wanted), r.pack_heads)
            found = 0  # the storage did not answer the walk: a miss, counted there
            if heads is not None:
                found = min(self.external.lookup_prefix(wanted, packs, looked), len(wanted))
            if found:
                external = await asyncio.to_thread(
                    self.external.load, wanted[:found], packs and packs[:found]
                )
            self.stats.external_queries += len(r.prompt) - r.local_hit_tokens
            self.stats.external_hits += external * self.block_size
        r.external_hit_tokens = external * self.block_size
        r.computed = (local + external) * self.block_size
        r.saved_blocks = local + external  # what came from a cache needs no save
        self.cache.insert(r.keys[: local + external], None, r.prompt)

    async def _save_new_blocks(
        self, chunks: list[tuple[SimRequest, int]], decoding: list[SimRequest]
    ) -> None:
        """Blocks this step completed go to the local cache and the external tier: prompt
        blocks as prefill fills them, then answer blocks as decode does (a decode step writes
        the KV of the token emitted last), as vLLM's prefix cache and the connector do."""
        to_save: list[bytes] = []
        packs: list[tuple[bytes, int] | None] = []  # with packs, per saved block (as the connector)
        m = self.external.pack_blocks if self.external is not None else 1

        def save(r: SimRequest, start: int, stop: int) -> None:
            new = r.keys[start:stop]
            tokens = r.tokens_of(start, stop, self.block_size) if self.cache.events is not None else []
            self.cache.insert(new, r.keys[start - 1] if start else None, tokens)
            to_save.extend(new)
            packs.extend(
                self.external.packs(r.keys, start, len(new), r.pack_heads) or [None] * len(new)
                if self.external
                else []
            )
            r.saved_blocks = stop

        for r, n in chunks:
            full = min((r.computed + n) // self.block_size, len(r.keys))
            if m > 1 and r.computed + n < len(r.prompt):
                full -= full % m  # while prefilling, whole packs only (the connector's rule)
            if full > r.saved_blocks:
                save(r, r.saved_blocks, full)
        for r in decoding:
            covered = len(r.prompt) + r.generated
            if r.cancelled or r.remote_kv or covered // self.block_size <= len(r.keys):
                continue
            extend_keys(r.keys, r.prompt + r.output[: covered - len(r.prompt)], self.block_size, r.namespace)
            if len(r.keys) > r.saved_blocks:
                save(r, r.saved_blocks, len(r.keys))
        if self.external is not None and to_save:
            await asyncio.to_thread(self.external.save, to_save, packs)

    def _emit(self, r: SimRequest, now: float) -> None:
        token = next_token(r.context_tail(), self.vocab)
        if r.generated == 0:
            self.stats.ttft.observe(now - r.arrival)
        else:
            self.stats.itl.observe(now - r.last_emit)
        r.last_emit = now
        r.generated += 1
        self.stats.generation_tokens += 1
        r.output.append(token)
        r.out.put_nowait(token)
        if r.generated >= r.max_tokens:
            self.running.remove(r)
            self._release(r)
            self.stats.finished += 1
            self.stats.e2e.observe(now - r.arrival)
            r.out.put_nowait(FINISHED)
