"""KV-cache traces in Mooncake's published format: load, make, write, turn into prompts, score.

One request per line of JSONL::

    {"timestamp": 27482, "input_length": 6955, "output_length": 52, "hash_ids": [46, 47, 2353]}

`timestamp` is in ms since the trace's start; one hash id is one block of `BLOCK_TOKENS` prompt
tokens and the same id always means the same tokens; the last block may be partial. See
docs/trace-format.md.
"""

from __future__ import annotations

import functools
import itertools
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

from ucmctl.bench.prompts import MIN_VOCAB
from ucmctl.core.errors import UcmctlError

BLOCK_TOKENS = 512
SESSION_CAP = 8  # `sessions`: a conversation starts over when it would pass SESSION_CAP x input_len
SPREAD = (0.5, 1.5)  # synthetic lengths are uniform in [0.5, 1.5] x the asked-for length
BLOCK_CACHE = 16384  # blocks of prompt tokens kept between calls: 32 MiB at 512 int32 tokens each

Pattern = Literal["shared-prefix", "sessions", "unique"]
PATTERNS: tuple[Pattern, ...] = ("shared-prefix", "sessions", "unique")
_FORMAT = 'one JSON object per line: {"timestamp": ms, "input_length": N, "output_length": N, "hash_ids": []}'


@dataclass(frozen=True)
class TraceRequest:
    line: int  # 1-based line number in the file
    timestamp_ms: float
    input_length: int
    output_length: int
    hash_ids: tuple[int, ...]


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _show(value: object) -> str:
    text = json.dumps(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _blocks_range(n_ids: int, block_tokens: int) -> tuple[int, int]:
    return (n_ids - 1) * block_tokens + 1, n_ids * block_tokens


def _parse(
    obj: Any, where: dict[str, Any], block_tokens: int
) -> tuple[float | None, int, int, tuple[int, ...]]:
    """One line's fields; the timestamp is None when the line has none."""

    def bad(key: str, message: str, fix: str) -> UcmctlError:
        return UcmctlError.one(message, key=key, fix=fix, **where)

    if not isinstance(obj, dict):
        kind = {list: "list", str: "string", bool: "boolean", type(None): "null"}.get(type(obj), "number")
        raise UcmctlError.one(f"expected a JSON object, found a {kind}", fix=_FORMAT, **where)
    for key in ("hash_ids", "input_length", "output_length"):
        if key not in obj:
            raise bad(
                key, "missing", "every request needs timestamp, input_length, output_length and hash_ids"
            )
    ts: Any = obj.get("timestamp")
    ms = float(ts) if isinstance(ts, float) or (_is_int(ts) and abs(ts) < 2**63) else math.nan
    if "timestamp" in obj and not (math.isfinite(ms) and ms >= 0):
        raise bad("timestamp", f"must be a number of ms >= 0, found {_show(ts)}", "ms since the trace start")
    lengths = []
    for key in ("input_length", "output_length"):
        value = obj[key]
        if not _is_int(value) or value < 1:
            raise bad(key, f"must be an integer >= 1, found {_show(value)}", "a count of tokens")
        lengths.append(value)
    ids = obj["hash_ids"]
    wrong = [] if not isinstance(ids, list) else [i for i, h in enumerate(ids) if not (_is_int(h) and h >= 0)]
    if not isinstance(ids, list) or not ids or wrong:
        found = f"item {wrong[0]} is {_show(ids[wrong[0]])}" if wrong else f"found {_show(ids)}"
        raise bad(
            "hash_ids",
            f"must be a non-empty list of integers >= 0, {found}",
            f"one id per block of {block_tokens} prompt tokens",
        )
    low, high = _blocks_range(len(ids), block_tokens)
    if not low <= lengths[0] <= high:
        raise bad(
            "input_length",
            f"{lengths[0]} does not fit {len(ids)} hash ids of {block_tokens} tokens: "
            f"it must be between {low} and {high}",
            f"fix input_length or hash_ids, or the block size if the trace uses another than {block_tokens}",
        )
    return (ms if "timestamp" in obj else None), lengths[0], lengths[1], tuple(ids)


def load_trace(path: Path, block_tokens: int = BLOCK_TOKENS) -> list[TraceRequest]:
    """Every request, in file order (sorted by timestamp if the file is not; stable)."""
    if block_tokens < 1:
        raise UcmctlError.one(f"block of {block_tokens} tokens", key="--block-tokens", fix="use at least 1")
    file = str(path)
    try:
        data = Path(path).read_bytes()
    except OSError as e:
        raise UcmctlError.one(
            f"cannot read the trace: {e.strerror or e}", file=file, fix="give the path of a JSONL trace file"
        ) from e
    data = data.removeprefix(b"\xef\xbb\xbf")
    reqs: list[TraceRequest] = []
    first_has_ts: bool | None = None
    for number, raw in enumerate(data.split(b"\n"), start=1):
        where: dict[str, Any] = {"file": file, "line": number}
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise UcmctlError.one("not UTF-8 text", fix=_FORMAT, **where) from e
        if not text.strip():
            continue
        try:
            obj = json.loads(text)
        except json.JSONDecodeError as e:
            raise UcmctlError.one(f"not JSON: {e.msg} at column {e.colno}", fix=_FORMAT, **where) from e
        ts, input_length, output_length, ids = _parse(obj, where, block_tokens)
        has_ts = ts is not None
        if first_has_ts is None:
            first_has_ts = has_ts
        elif has_ts != first_has_ts:
            first = reqs[0].line
            message = (
                f"has a timestamp but line {first} has none"
                if has_ts
                else f"has no timestamp but line {first} has one"
            )
            raise UcmctlError.one(
                message,
                key="timestamp",
                fix="give every line a timestamp, or none to replay the requests back to back",
                **where,
            )
        reqs.append(TraceRequest(number, ts or 0.0, input_length, output_length, ids))
    if not reqs:
        raise UcmctlError.one("the trace has no requests", file=file, fix=_FORMAT)
    if any(a.timestamp_ms > b.timestamp_ms for a, b in itertools.pairwise(reqs)):
        reqs.sort(key=lambda r: r.timestamp_ms)  # stable: ties keep their file order
    return reqs


@functools.lru_cache(maxsize=BLOCK_CACHE)
def _block(seed: int, stream: int, hash_id: int, vocab: int, block_tokens: int, first_id: int) -> np.ndarray:
    """The tokens of one hash id: read-only, shared by every prompt that holds the id."""
    words = [seed & 0xFFFFFFFF, stream & 0xFFFFFFFF, hash_id & 0xFFFFFFFF, hash_id >> 32]
    rng = np.random.Generator(np.random.PCG64(words))
    block = rng.integers(first_id, vocab, size=block_tokens, dtype=np.int32)
    block.flags.writeable = False
    return block


def prompt_ids(
    req: TraceRequest,
    *,
    seed: int,
    stream: int,
    vocab: int,
    block_tokens: int = BLOCK_TOKENS,
    first_id: int = 10,
) -> list[int]:
    """input_length token ids: block k is the tokens of hash id req.hash_ids[k] (block_tokens ids
    drawn in [first_id, vocab) from a PRNG seeded by (seed, stream, hash id)), the last block cut to
    what input_length leaves."""
    if vocab < max(MIN_VOCAB, first_id + 1) or first_id < 0:
        raise UcmctlError.one(
            f"vocabulary of {vocab} tokens (first id {first_id}) is too small",
            key="--vocab",
            fix=f"use at least {max(MIN_VOCAB, first_id + 1)}",
        )
    if block_tokens < 1:
        raise UcmctlError.one(f"block of {block_tokens} tokens", key="--block-tokens", fix="use at least 1")
    needed = -(-req.input_length // block_tokens)
    if req.input_length < 1 or needed > len(req.hash_ids):
        low, high = _blocks_range(len(req.hash_ids), block_tokens)
        raise UcmctlError.one(
            f"input_length {req.input_length} does not fit {len(req.hash_ids)} hash ids of "
            f"{block_tokens} tokens: it must be between {low} and {high}",
            line=req.line,
            key="input_length",
        )
    blocks = [_block(seed, stream, h, vocab, block_tokens, first_id) for h in req.hash_ids[:needed]]
    return np.concatenate(blocks)[: req.input_length].tolist()


@dataclass(frozen=True)
class IdealHits:
    reused_tokens: int
    total_tokens: int
    per_request: tuple[int, ...]  # reused tokens of each request, in order

    @property
    def ratio(self) -> float | None:
        return self.reused_tokens / self.total_tokens if self.total_tokens else None


def ideal_hits(
    reqs: Sequence[TraceRequest], *, block_size: int = 16, block_tokens: int = BLOCK_TOKENS
) -> IdealHits:
    """The prefix-cache hit of an unbounded cache that keeps every earlier request's prompt.

    Requests count in timestamp order (stable); per_request[i] is the hit of reqs[i]. Block k of a
    request is reused when the chain hash_ids[0..k] began an earlier request, for as many tokens as
    the longest earlier copy of that block had (a partial last block covers only its tokens); the
    walk stops at the first block not covered whole. The hit is capped at input_length - 1 (the
    engine computes the last prompt token) and floored to whole blocks of `block_size` tokens.
    """
    if block_size < 1 or block_tokens < 1:
        raise UcmctlError.one(f"block sizes must be >= 1, found {block_size} and {block_tokens}")
    # A trie of chains: node (parent, hash id) -> its number; longest[node] = most tokens any earlier
    # request had in that chain's last block. Node 0 is the empty chain.
    children: dict[tuple[int, int], int] = {}
    longest: list[int] = [0]
    per_request = [0] * len(reqs)
    for i in sorted(range(len(reqs)), key=lambda j: reqs[j].timestamp_ms):
        req = reqs[i]
        node, reused, walking = 0, 0, True
        for k, h in enumerate(req.hash_ids):
            size = min(block_tokens, req.input_length - k * block_tokens)
            if size <= 0:
                break
            child = children.get((node, h))
            if child is None:
                walking = False
                child = children[(node, h)] = len(longest)
                longest.append(size)
            else:
                if walking:
                    covered = min(size, longest[child])
                    reused += covered
                    walking = covered == size
                longest[child] = max(longest[child], size)
            node = child
        reused = min(reused, req.input_length - 1)
        per_request[i] = reused - reused % block_size
    return IdealHits(sum(per_request), sum(r.input_length for r in reqs), tuple(per_request))


def _bad_param(key: str, message: str) -> UcmctlError:
    return UcmctlError.one(message, key=key)


def _check_params(
    requests: int,
    rate: float | None,
    input_len: int,
    output_len: int,
    pattern: Pattern,
    groups: int,
    shared_fraction: float,
    block_tokens: int,
) -> None:
    """`make_trace`'s parameters, each refused under its option's name."""
    if not _is_int(requests) or requests < 1:
        raise _bad_param("--requests", f"must be an integer >= 1, found {requests}")
    if rate is not None and not (math.isfinite(rate) and rate > 0):
        raise _bad_param("--rate", f"must be > 0 requests/s (or left out for all at once), found {rate}")
    if not _is_int(input_len) or input_len < 1:
        raise _bad_param("--input-len", f"must be an integer >= 1, found {input_len}")
    if not _is_int(output_len) or output_len < 1:
        raise _bad_param("--output-len", f"must be an integer >= 1, found {output_len}")
    if pattern not in PATTERNS:
        raise _bad_param("--pattern", f"must be one of {', '.join(PATTERNS)}, found {pattern!r}")
    if not _is_int(groups) or groups < 1:
        raise _bad_param("--groups", f"must be an integer >= 1, found {groups}")
    if not 0 <= shared_fraction <= 1:
        raise _bad_param("--shared-fraction", f"must be between 0 and 1, found {shared_fraction}")
    if block_tokens < 1:
        raise _bad_param("--block-tokens", f"must be >= 1, found {block_tokens}")


def make_trace(
    *,
    requests: int,
    rate: float | None,
    input_len: int,
    output_len: int,
    pattern: Pattern,
    groups: int,
    shared_fraction: float,
    seed: int,
    block_tokens: int = BLOCK_TOKENS,
) -> list[TraceRequest]:
    """A synthetic trace with a chosen reuse pattern, deterministic from `seed`.

    Arrivals are Poisson at `rate` requests/s (ms, rounded, the first at 0), or all at 0 when rate
    is None. Lengths are uniform integers in [0.5, 1.5] x input_len (output_len), at least 1.
    unique: every block a fresh id. shared-prefix: each request picks one of `groups` groups; its
    first round(shared_fraction x input_length / block_tokens) blocks are the group's own ids, the
    rest fresh. sessions: each request picks one of `groups` conversations and repeats all of that
    conversation's previous hash ids, then adds fresh blocks for ~(1 - shared_fraction) x input_len
    new tokens (at least 1); a conversation starts over with a fresh ~input_len prompt when it would
    pass SESSION_CAP x input_len tokens.
    """
    _check_params(requests, rate, input_len, output_len, pattern, groups, shared_fraction, block_tokens)
    rng = np.random.Generator(np.random.PCG64([seed & 0xFFFFFFFF, (seed >> 32) & 0xFFFFFFFF, 0x7ACE]))
    if rate is None:
        stamps = [0.0] * requests
    else:
        gaps = rng.exponential(1000.0 / rate, size=requests - 1)
        stamps = np.rint(np.concatenate(([0.0], np.cumsum(gaps)))).tolist()

    def around(length: float) -> int:
        low, high = (max(1, round(f * length)) for f in SPREAD)
        return int(rng.integers(low, high + 1))

    next_id = 0

    def fresh(n: int) -> tuple[int, ...]:
        nonlocal next_id
        next_id += n
        return tuple(range(next_id - n, next_id))

    def blocks(tokens: int) -> int:
        return -(-tokens // block_tokens)

    # shared-prefix: every group's run is as long as the longest prompt, so any prefix fits.
    longest = blocks(max(1, round(SPREAD[1] * input_len)))
    runs = [fresh(longest) for _ in range(groups)] if pattern == "shared-prefix" else []
    sessions: list[tuple[int, ...]] = [()] * groups  # each conversation's hash ids so far
    reqs = []
    for i, ts in enumerate(stamps):
        output_length = around(output_len)
        if pattern == "unique":
            length = around(input_len)
            ids = fresh(blocks(length))
        elif pattern == "shared-prefix":
            length = around(input_len)
            n = blocks(length)
            shared = min(n, math.floor(shared_fraction * length / block_tokens + 0.5))
            ids = runs[int(rng.integers(groups))][:shared] + fresh(n - shared)
        else:
            g = int(rng.integers(groups))
            context = sessions[g]
            new = around(input_len * (1 - shared_fraction))
            length = len(context) * block_tokens + new
            if not context or length > SESSION_CAP * input_len:
                context, length = (), around(input_len)
                new = length
            ids = context + fresh(blocks(new))
            sessions[g] = ids
        reqs.append(TraceRequest(i + 1, float(ts), length, output_length, ids))
    return reqs


def write_trace(reqs: Sequence[TraceRequest], path: Path) -> None:
    """JSONL in Mooncake's key order (timestamp, input_length, output_length, hash_ids); a whole
    timestamp is written as an integer number of ms."""
    lines = []
    for r in reqs:
        ts: float | int = int(r.timestamp_ms) if float(r.timestamp_ms).is_integer() else r.timestamp_ms
        row = {"timestamp": ts, "input_length": r.input_length, "output_length": r.output_length}
        lines.append(json.dumps({**row, "hash_ids": list(r.hash_ids)}) + "\n")
    try:
        Path(path).write_text("".join(lines))
    except OSError as e:
        raise UcmctlError.one(f"cannot write the trace: {e.strerror or e}", file=str(path)) from e


def send_schedule(reqs: Sequence[TraceRequest], speedup: float | None) -> list[float]:
    """Seconds from the replay's start at which each request is due: (timestamp_ms - first
    timestamp) / 1000 / speedup; None replays back to back (all 0.0)."""
    if speedup is None:
        return [0.0] * len(reqs)
    if not (math.isfinite(speedup) and speedup > 0):
        raise UcmctlError.one(
            f"must be > 0, found {speedup}", key="--speedup", fix="2 replays twice as fast as the trace"
        )
    if not reqs:
        return []
    first = min(r.timestamp_ms for r in reqs)
    return [(r.timestamp_ms - first) / 1000.0 / speedup for r in reqs]
