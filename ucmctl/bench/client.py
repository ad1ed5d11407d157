"""The load generator: streamed /v1/completions requests over one aiohttp session.

Timing follows `vllm bench serve`: TTFT is the arrival of the first SSE event that carries
choices, each later such event adds an inter-token latency, and the end-to-end latency ends at
the last one. Token events are recognised by a byte check (no JSON decoding per token); the
few other events (the usage chunk, errors) are decoded. Token counts come from the final
usage chunk, and every request's `usage.prompt_tokens` must equal the prompt it was sent.

Given several front doors (a deployment's proxy replicas), requests are spread over them in
turn, and one whose connection a door refuses (a dead proxy: nothing was sent) goes to the
next, as a client with several endpoints does.
"""

from __future__ import annotations

import asyncio
import gc
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import numpy as np

HEADERS = {"Content-Type": "application/json", "Accept": "text/event-stream"}
_CHOICES = b'"choices":'


@dataclass
class RequestResult:
    index: int
    prompt_len: int  # tokens sent
    ok: bool = False
    error: str = ""
    usage_prompt_tokens: int | None = None
    output_tokens: int = 0
    cached_tokens: int | None = None
    ttft: float = 0.0
    itl: list[float] = field(default_factory=list)
    latency: float = 0.0
    start_time: float = 0.0
    token_ids: list[int] | None = None  # the answer's ids, when the phase asked for them
    lag: float | None = None  # seconds the send came after its scheduled time (replays)
    door: int = 0  # of the phase's URLs, the one that answered (or the last one tried)
    refused: int = 0  # doors that refused its connection (all of them where none took it)
    sent_on: bool = False  # a door took it after another had refused it


@dataclass
class PhaseRun:
    results: list[RequestResult]
    duration: float


def make_body(
    prompt: Sequence[int],
    max_tokens: int,
    model: str | None,
    ignore_eos: bool,
    temperature: float | None,
    return_token_ids: bool = False,
    cache_salt: str | None = None,
    user: str | None = None,
) -> bytes:
    """The request's JSON, encoded once before the clock starts. `cache_salt` (vLLM's, in every
    block hash and so every store key): prompts of another salt share no cached block. `user`
    (OpenAI's): the conversation, as a chat client names its user; a session router reads it."""
    body: dict[str, Any] = {
        "prompt": list(prompt),
        "max_tokens": max_tokens,
        "stream": True,
        "stream_options": {"include_usage": True},
        "ignore_eos": ignore_eos,
    }
    if return_token_ids:  # vLLM >= 0.10.2 (and the simulator) put the ids in every chunk
        body["return_token_ids"] = True
    if model:
        body["model"] = model
    if temperature is not None:
        body["temperature"] = temperature
    if cache_salt:
        body["cache_salt"] = cache_salt
    if user:
        body["user"] = user
    return json.dumps(body, separators=(",", ":")).encode()


def has_choices(event: bytes) -> bool:
    """Whether an SSE event is a chunk with a non-empty `choices` list (a token), without decoding."""
    i = event.find(_CHOICES)
    if i < 0:
        return False
    rest = event[i + len(_CHOICES) : i + len(_CHOICES) + 8].lstrip()
    return rest[:1] == b"[" and rest[1:].lstrip()[:1] not in (b"]", b"")


def _token_ids(event: bytes) -> list[int] | None:
    """The ids a token chunk carries (`choices[0].token_ids`), None when it carries none."""
    try:
        data = json.loads(event.removeprefix(b"data:").strip())
        ids = data["choices"][0].get("token_ids")
    except (ValueError, KeyError, IndexError, TypeError, AttributeError):
        return None
    return [int(t) for t in ids] if isinstance(ids, list) else None


def _finish(out: RequestResult, tail: list[bytes], got_token: bool) -> None:
    """Read the non-token events (usage, errors) and decide whether the request succeeded."""
    usage: dict[str, Any] | None = None
    for event in tail:
        payload = event.removeprefix(b"data:").strip()
        if not payload or payload == b"[DONE]" or event.startswith(b":"):
            continue
        try:
            data = json.loads(payload)
        except ValueError:
            out.error = f"undecodable event: {payload[:120]!r}"
            return
        if isinstance(data, dict) and data.get("error"):
            err = data["error"]
            out.error = f"error event: {err.get('message', err) if isinstance(err, dict) else err}"
            return
        if isinstance(data, dict) and data.get("usage"):
            usage = data["usage"]
    if not got_token:
        out.error = "no chunk with choices came (no TTFT)"
        return
    if usage is None:
        out.error = "no usage in the stream (the server ignored stream_options.include_usage)"
        return
    out.usage_prompt_tokens = usage.get("prompt_tokens")
    out.output_tokens = int(usage.get("completion_tokens") or 0)
    details = usage.get("prompt_tokens_details") or {}
    out.cached_tokens = details.get("cached_tokens")
    if out.usage_prompt_tokens != out.prompt_len:
        out.error = f"usage.prompt_tokens {out.usage_prompt_tokens} != {out.prompt_len} tokens sent"
        return
    if out.token_ids is not None and len(out.token_ids) != out.output_tokens:
        out.error = (
            f"the stream returned {len(out.token_ids)} token ids for "
            f"usage.completion_tokens {out.output_tokens}"
        )
        return
    out.ok = True


def _error_event(tail: list[bytes]) -> str | None:
    """The message of the first error event among the non-token events, if one came."""
    for event in tail:
        if b'"error"' not in event:
            continue
        try:
            err = json.loads(event.removeprefix(b"data:").strip())["error"]
        except (ValueError, KeyError, TypeError):
            continue
        if err:
            return f"error event: {err.get('message', err) if isinstance(err, dict) else err}"
    return None


async def send(
    session: aiohttp.ClientSession,
    url: str | Sequence[str],
    body: bytes,
    out: RequestResult,
    collect_tokens: bool = False,
    first: int = 0,
) -> None:
    """One streamed request; fills `out` (never raises). With `collect_tokens` every token chunk
    is decoded for its `token_ids` (the body must ask for them: make_body(return_token_ids=True)).
    With several URLs: to `url[first]`, and on to the next while a connection is refused."""
    urls = [url] if isinstance(url, str) else list(url)
    out.start_time = time.perf_counter()
    for k in range(len(urls)):
        out.door = (first + k) % len(urls)
        try:
            await _stream(session, urls[out.door], body, out, collect_tokens)
            out.sent_on = k > 0
            return
        except aiohttp.ClientConnectorError as exc:  # nothing was sent: the next door, if any
            out.refused += 1
            out.error = f"{type(exc).__name__}: {exc}"


async def _stream(
    session: aiohttp.ClientSession, url: str, body: bytes, out: RequestResult, collect_tokens: bool
) -> None:
    """`send` to one URL; raises only a refused connection (nothing was sent)."""
    perf = time.perf_counter
    start = last = out.start_time
    tail: list[bytes] = []
    got_token = False
    itl = out.itl
    token_ids: list[int] = []
    if collect_tokens:
        out.token_ids = token_ids
    try:
        async with session.post(url, data=body, headers=HEADERS) as resp:
            out.error = ""
            if resp.status != 200:
                text = (await resp.text(errors="replace"))[:300]
                out.error = f"HTTP {resp.status}: {text}"
                return
            buf = b""
            async for data in resp.content.iter_any():
                now = perf()
                buf += data
                if b"\n\n" not in buf:
                    continue
                *events, buf = buf.replace(b"\r\n", b"\n").split(b"\n\n")
                for event in events:
                    if has_choices(event):
                        if collect_tokens:
                            ids = _token_ids(event)
                            if ids is None:
                                out.error = "a token chunk without token_ids (return_token_ids ignored)"
                                return
                            token_ids.extend(ids)
                        if got_token:
                            itl.append(now - last)
                        else:
                            out.ttft = now - start
                            got_token = True
                        last = now
                    elif event.strip():
                        tail.append(event)
            if buf.strip():
                tail.append(buf)
    except aiohttp.ClientConnectorError:
        raise
    except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as exc:
        # an error event sent before the cut (a proxy's word on its upstream) says more
        out.error = _error_event(tail) or f"{type(exc).__name__}: {exc}"
        return
    out.latency = last - start
    _finish(out, tail, got_token)


def session(concurrency: int, timeout_s: float) -> aiohttp.ClientSession:
    """The one session of a benchmark: a pool with room for every concurrent stream."""
    connector = aiohttp.TCPConnector(
        limit=concurrency + 8,
        limit_per_host=0,
        ttl_dns_cache=300,
        keepalive_timeout=60,
        enable_cleanup_closed=True,
    )
    timeout = aiohttp.ClientTimeout(total=timeout_s, sock_connect=30)
    return aiohttp.ClientSession(
        connector=connector, timeout=timeout, read_bufsize=2**18, auto_decompress=False
    )


BodyFactory = Callable[[int], bytes]


async def run_phase(
    http: aiohttp.ClientSession,
    url: str | Sequence[str],
    bodies: Sequence[bytes] | BodyFactory,
    prompt_lens: Sequence[int],
    concurrency: int,
    request_rate: float = float("inf"),
    seed: int = 0,
    on_done: Callable[[RequestResult], None] | None = None,
    schedule: Sequence[float] | None = None,
    collect_tokens: bool = False,
) -> PhaseRun:
    """Send every request, at most `concurrency` at once. Arrivals: at the `schedule` (seconds
    from the start: a trace replay), else Poisson at `request_rate` (all at once when infinite),
    as `vllm bench serve --request-rate R --max-concurrency C` does. `bodies` may be a factory:
    then bodies are encoded a few ahead while the loop waits for the next arrival, not all
    before the start (a long trace's prompts would not fit in memory). Several URLs: request i
    goes to the i-th in turn (`send`)."""
    gate = asyncio.Semaphore(max(1, concurrency))
    n = len(prompt_lens)
    results = [RequestResult(i, k) for i, k in enumerate(prompt_lens)]
    make = bodies.__getitem__ if isinstance(bodies, Sequence) else bodies
    ready: dict[int, bytes] = {}

    async def one(i: int, body: bytes, due: float | None) -> None:
        async with gate:
            if due is not None:
                results[i].lag = max(0.0, time.perf_counter() - (start + due))
            await send(http, url, body, results[i], collect_tokens, first=i)
        if on_done is not None:
            on_done(results[i])

    rng = np.random.default_rng(seed)
    due_times = list(schedule) if schedule is not None else None
    if due_times is None:
        due_times = [0.0] * n
        if request_rate != float("inf"):
            arrival = 0.0
            for i in range(1, n):
                arrival += float(rng.exponential(1.0 / request_rate))
                due_times[i] = arrival
    for i in range(min(n, 8)):  # the first few before the clock starts
        ready[i] = make(i)
    # What exists now lives through the phase: out of the collector's sight, a full collection
    # does not walk it (tens of ms, a late send), as `vllm bench serve` does.
    gc.collect()
    gc.freeze()
    start = time.perf_counter()
    tasks = []
    prepared = len(ready)
    for i in range(n):
        while True:
            delay = start + due_times[i] - time.perf_counter()
            if delay <= 0:
                break
            if prepared < n and prepared < i + 256 and delay > 0.003:
                ready[prepared] = make(prepared)  # idle time: encode the next body
                prepared += 1
                continue
            # The loop's timers wake up to a millisecond late (epoll's resolution): sleep to
            # just short of the send time, then yield until it comes.
            await asyncio.sleep(delay - 0.0015 if delay > 0.002 else 0)
        body = ready.pop(i) if i in ready else make(i)
        prepared = max(prepared, i + 1)
        tasks.append(asyncio.create_task(one(i, body, due_times[i] if schedule is not None else None)))
    try:
        await asyncio.gather(*tasks)
    finally:
        gc.unfreeze()
    return PhaseRun(results, time.perf_counter() - start)
