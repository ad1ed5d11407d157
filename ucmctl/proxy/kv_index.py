"""Where the KV of a prompt's leading blocks is, as the proxy's own routing history says: in which
instances' own caches (HBM, or DRAM on the CPU) and whether in the shared store.

A prompt is cut into blocks of the servers' block size (token ids exactly, a text prompt's from
an instance's /tokenize where it answers: proxy/tokenize; else its text by `CHARS_PER_TOKEN`
characters a token, an estimate that meets only the proxy's own routing history), each named by
a 64-bit hash chained over the blocks before it and the model, so a block's key names its whole
prefix, as vLLM's block hashes do. When an instance computed or loaded a prompt, its blocks are
in its cache; when a prefill (or a mixed instance) computed it, the connector saved its blocks to
the store. Both are approximate: the index does not see an instance evict a block, nor the store
refuse a save; an instance that comes back into routing (it may have restarted) holds nothing of
what it held before (its `epoch`), and one added again at the same URL is another instance. The
index is bounded: the least recently used blocks go first, a prompt's last blocks before its first.
"""

from __future__ import annotations

import array
import hashlib
from collections import OrderedDict
from collections.abc import Sequence
from functools import cache, lru_cache
from typing import Any

import numpy as np

from ucmctl.proxy.jsontext import Texts
from ucmctl.proxy.pool import Instance
from ucmctl.proxy.rewrite import CHARS_PER_TOKEN, prompt_of

try:  # the keys and the index in C (csrc/kv_index.cpp): a 32k-token prompt's decision in ~0.1 ms, not ~2
    import ucmctl.proxy._kv as _native
except ImportError:  # a source tree not built: the same in Python (numpy), below
    _native = None
else:
    Sequence.register(_native.Keys)  # a prompt's keys kept in C: a sequence of ints

ENTRIES = 262_144  # blocks remembered (a few tens of MiB at most)
Holder = tuple[int, int]  # an instance's uid and epoch


# The keys are 64-bit integers: a polynomial hash of each block's units (token ids, or a text
# prompt's bytes), each mixed on its own (y ^ y >> 31, y = u * M: a bijection, one multiply),
# chained over the blocks before it, then mixed again (splitmix64's finaliser). Computed over the
# whole prompt at once with numpy's wrapping uint64 arithmetic (csrc/kv_index.cpp the same in C):
#     b[i] = sum_j unit(u[i, j]) * R**j,  p[i] = p[i-1] * S + b[i]
# (p[-1] the model's seed, S = R ** units a block), which
# unrolls to p[i] = S**(i+1) * (seed + S**-1 * cumsum(b[k] * S**-k)), S odd and so invertible mod
# 2**64. Not a cryptographic digest: two prompts that meet on one key only share a routing guess.
_R = 0x9E3779B97F4A7C15  # odd
_M = 0xBF58476D1CE4E5B9  # odd


def _unit(x: np.ndarray) -> np.ndarray:
    """A unit mixed on its own, element-wise (uint64, wrapping)."""
    y = x * np.uint64(_M)
    return y ^ (y >> np.uint64(31))


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser, element-wise (uint64, wrapping)."""
    x = x ^ (x >> np.uint64(30))
    x = x * np.uint64(0xBF58476D1CE4E5B9)
    x = x ^ (x >> np.uint64(27))
    x = x * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


@cache
def _powers(units: int, blocks: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """R**j for a block's units, S**i and S**-i for the blocks (all mod 2**64)."""
    r = np.cumprod(np.full(units, _R, dtype=np.uint64)) * np.uint64(pow(_R, -1, 1 << 64))
    step = pow(_R, units, 1 << 64)
    s = np.cumprod(np.full(blocks, step, dtype=np.uint64))  # S**1 .. S**blocks
    inv = np.cumprod(np.full(blocks, pow(step, -1, 1 << 64), dtype=np.uint64)) * np.uint64(step)
    for shared in (r, s, inv):  # cached: every call reads the same arrays
        shared.flags.writeable = False
    return r, s, inv  # inv: S**0 .. S**-(blocks-1)


def _sums(units: np.ndarray, per_block: int, seed: int) -> np.ndarray:
    """The chain's values p[i] of the whole blocks of `units`, before the last mix (uint64)."""
    n = len(units) // per_block
    r, s, inv = _powers(per_block, _capacity(n))
    with np.errstate(over="ignore"):
        mixed = _unit(units[: n * per_block].astype(np.uint64)).reshape(n, per_block)
        b = (mixed * r).sum(axis=1, dtype=np.uint64)
        return s[:n] * (np.uint64(seed) + inv[1] * np.cumsum(b * inv[:n], dtype=np.uint64))


def _chain(units: np.ndarray, per_block: int, seed: int) -> tuple[int, ...]:
    if len(units) < per_block:
        return ()
    with np.errstate(over="ignore"):
        return tuple(_mix(_sums(units, per_block, seed)).tolist())


def extend(after: int, token_ids: Sequence[int], block_size: int) -> tuple[list[int], list[int]]:
    """The chain continued over whole blocks of token ids after the chain value `after` (a
    model's `seed`, or a value this returned): the values to continue from, and the blocks' keys,
    the keys `block_keys` gives the same blocks of a prompt."""
    if len(token_ids) < block_size:
        return [], []
    with np.errstate(over="ignore"):
        sums = _sums(np.asarray(token_ids, dtype=np.int64), block_size, after)
        return sums.tolist(), _mix(sums).tolist()


def _text_chain(data: bytes, per_block: int, seed: int) -> Sequence[int]:
    """A text prompt's blocks of bytes, hashed 8 bytes at a time (little-endian words) where a
    block is whole words, as with every even block size."""
    if _native is not None:
        return _native.bytes_keys(data, per_block, seed)  # type: ignore[no-any-return]
    if per_block % 8:
        return _chain(np.frombuffer(data, dtype=np.uint8), per_block, seed)
    words = len(data) // per_block * per_block // 8
    return _chain(np.frombuffer(data, dtype="<u8", count=words), per_block // 8, seed)


def _capacity(n: int) -> int:
    """Powers are made for a whole power of two of blocks (cached), at least `n`."""
    return 1 << max(n - 1, 1).bit_length()


@lru_cache(maxsize=64)  # the model name comes from the client: bounded
def seed(model: str) -> int:
    """The chain's start for a model's prompts."""
    return int.from_bytes(hashlib.blake2b(model.encode(), digest_size=8).digest(), "little")


def block_keys(body: dict[str, Any], path: str, block_size: int, texts: Texts | None = None) -> Sequence[int]:
    """The keys of the prompt's full blocks, each chained over the ones before and the model;
    read off the ids the parse packed where `texts` (the body's long values) has them."""
    prompt = prompt_of(body, path)
    if isinstance(prompt, str):
        start = seed(str(body.get("model", "")))
        return _text_chain(prompt.encode(), block_size * CHARS_PER_TOKEN, start)
    long = texts.get("prompt") if texts else None
    if _native is not None and long is not None and long.ids is not None and long.value is prompt:
        return _native.packed_keys(long.ids, block_size, seed(str(body.get("model", ""))))  # type: ignore[no-any-return]
    return ids_keys(prompt, str(body.get("model", "")), block_size)


def ids_keys(token_ids: Sequence[int], model: str, block_size: int) -> Sequence[int]:
    """The keys of the full blocks of a prompt's token ids, as `block_keys` names a token-id
    prompt's (and the KV-cache events' blocks meet them)."""
    if _native is not None:  # None: items that are not ints (the conversion below decides)
        keys = _native.ids_keys(token_ids, block_size, seed(model))
        if keys is not None:
            return keys  # type: ignore[no-any-return]
    try:  # token ids as 8-byte integers, checked and converted in C
        ids = array.array("q", token_ids)
    except (OverflowError, TypeError):  # not ids a model has: no blocks to know of
        return ()
    return _chain(np.frombuffer(ids, dtype=np.int64), block_size, seed(model))


def new_index(entries: int = ENTRIES) -> KvIndex:
    """The index, in C where it is built."""
    return KvIndex(entries) if _native is None else NativeKvIndex(entries)


class KvIndex:
    """The index in Python: the reference of NativeKvIndex, and the index where that is not built."""

    def __init__(self, entries: int = ENTRIES) -> None:
        # block key -> (the instances that hold it, whether the store has it)
        self._blocks: OrderedDict[int, tuple[frozenset[Holder], bool]] = OrderedDict()
        self._entries = entries

    def __len__(self) -> int:
        return len(self._blocks)

    def held(self, keys: Sequence[int], inst: Instance) -> int:
        """How many leading blocks `inst` holds in its own cache."""
        return self.leading(keys, [inst])[0][0]

    def stored(self, keys: Sequence[int]) -> int:
        """How many leading blocks the store holds."""
        return self.leading(keys, [])[1]

    def leading(self, keys: Sequence[int], insts: Sequence[Instance]) -> tuple[list[int], int]:
        """How many leading blocks each of `insts` holds in its own cache, and how many the store
        holds: one walk over the keys for all of them, ended where none holds the next block."""
        mine = [(i.uid, i.epoch) for i in insts]
        held = [0] * len(insts)
        live = list(range(len(insts)))
        stored, storing = 0, True
        for n, key in enumerate(keys, 1):
            entry = self._blocks.get(key)
            if entry is None:
                break
            holders, in_store = entry
            if storing and in_store:
                stored = n
            else:
                storing = False
            live = [k for k in live if mine[k] in holders]
            for k in live:
                held[k] = n
            if not live and not storing:
                break
        return held, stored

    def took(self, keys: Sequence[int], inst: Instance, *, saved: bool) -> None:
        """`inst` computed or loaded these blocks (and, `saved`, the store has them now). They
        are touched last to first, so that the bound takes a prompt's tail before its head (as
        vLLM frees a request's blocks): what stays of a prompt is a prefix, which a walk finds."""
        me = (inst.uid, inst.epoch)
        for key in reversed(keys):
            holders, stored = self._blocks.pop(key, (frozenset(), False))
            # a holder from an earlier epoch of the same instance is gone
            kept = frozenset(h for h in holders if h[0] != inst.uid)
            self._blocks[key] = (kept | {me}, stored or saved)
        while len(self._blocks) > self._entries:
            self._blocks.popitem(last=False)

    def lost(self, keys: Sequence[int], inst: Instance) -> None:
        """`inst` no longer holds these blocks in its own cache (it evicted them)."""
        for key in keys:
            entry = self._blocks.get(key)
            if entry is not None:
                self._blocks[key] = (frozenset(h for h in entry[0] if h[0] != inst.uid), entry[1])


class NativeKvIndex(KvIndex):
    """The index in C (csrc/kv_index.cpp): KvIndex's answers, a 32k-token prompt's walk in tens
    of microseconds."""

    def __init__(self, entries: int = ENTRIES) -> None:
        self._index = _native.Index(entries)

    def __len__(self) -> int:
        return len(self._index)

    def leading(self, keys: Sequence[int], insts: Sequence[Instance]) -> tuple[list[int], int]:
        """How many leading blocks each of `insts` holds in its own cache, and how many the store
        holds."""
        return self._index.leading(keys, [(i.uid, i.epoch) for i in insts])  # type: ignore[no-any-return]

    def took(self, keys: Sequence[int], inst: Instance, *, saved: bool) -> None:
        """`inst` computed or loaded these blocks (and, `saved`, the store has them now)."""
        self._index.took(keys, (inst.uid, inst.epoch), saved)

    def lost(self, keys: Sequence[int], inst: Instance) -> None:
        """`inst` no longer holds these blocks in its own cache (it evicted them)."""
        self._index.lost(keys, inst.uid)
