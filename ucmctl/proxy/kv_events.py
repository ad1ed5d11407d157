"""vLLM's KV-cache events as the proxy reads them: what an instance's own cache gained and lost.

The engine publishes (with `--kv-events-config`, publisher zmq) multipart messages of
(topic, sequence number as 8 big-endian bytes, payload); the payload is a msgpack
`KVEventBatch` (vllm/distributed/kv_events.py): an array [ts, events, data_parallel_rank], each
event a map tagged by its `type`: `BlockStored` (block_hashes, parent_block_hash, token_ids,
block_size, medium, ...), `BlockRemoved` (block_hashes, medium), `AllBlocksCleared`.

vLLM's block hashes are its own (they depend on its hash algorithm and seed), so an instance's
events are turned into the proxy's block keys (kv_index.block_keys: a chain over the token ids):
a stored block's key continues the chain from its parent's chain value over its token ids, so
per instance vLLM's hash is mapped to that value (to continue from) and to the key (so that a
removal, which names only vLLM's hash, finds it). A malformed event is an error of that event
only (`BadEvent`): the caller counts and skips it.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

import msgspec

from ucmctl.proxy.kv_index import extend, seed

MEDIUM_HBM = ("GPU", None)  # the engine's own cache; a connector's events name their medium


class BadEvent(ValueError):
    """An event or batch that is not vLLM's KV-event schema."""


@dataclass(frozen=True)
class Stored:
    hashes: tuple[Any, ...]  # vLLM's block hashes (bytes or int), in order
    parent: Any  # the hash of the block before the first, or None
    token_ids: tuple[int, ...]
    block_size: int
    medium: str | None


@dataclass(frozen=True)
class Removed:
    hashes: tuple[Any, ...]
    medium: str | None


@dataclass(frozen=True)
class Cleared:
    pass


Event = Stored | Removed | Cleared


def decode(payload: bytes) -> list[Event | BadEvent]:
    """The events of one batch, in order; a malformed event is a `BadEvent` in its place (the
    others still count); a batch that cannot be read at all raises `BadEvent`."""
    try:
        batch = msgspec.msgpack.decode(payload)
    except msgspec.DecodeError as exc:
        raise BadEvent(f"not msgpack: {exc}") from None
    if not isinstance(batch, list) or len(batch) < 2 or not isinstance(batch[1], list):
        raise BadEvent("not a KVEventBatch [ts, events, ...]")
    return [_event(e) for e in batch[1]]


def _event(e: Any) -> Event | BadEvent:
    if not isinstance(e, dict):
        return BadEvent(f"an event that is not a map: {type(e).__name__}")
    kind = e.get("type")
    try:
        if kind == "BlockStored":
            ids, size, hashes = e["token_ids"], int(e["block_size"]), tuple(e["block_hashes"])
            if size < 1 or len(ids) != size * len(hashes) or not all(type(t) is int for t in ids):
                return BadEvent(f"BlockStored: {len(ids)} token ids for {len(hashes)} blocks of {size}")
            return Stored(hashes, e.get("parent_block_hash"), tuple(ids), size, e.get("medium"))
        if kind == "BlockRemoved":
            return Removed(tuple(e["block_hashes"]), e.get("medium"))
        if kind == "AllBlocksCleared":
            return Cleared()
    except (KeyError, TypeError, ValueError) as exc:
        return BadEvent(f"{kind}: {exc}")
    return BadEvent(f"unknown event type {kind!r}")


@dataclass
class Translation:
    """One instance's vLLM block hashes -> the proxy's keys, bounded (`entries` blocks)."""

    model: str
    entries: int = 262_144
    # vLLM's hash -> (the chain's value after the block, the block's key), least recent first
    blocks: OrderedDict[Any, tuple[int, int]] = field(default_factory=OrderedDict)

    def stored(self, event: Stored) -> list[int] | None:
        """The proxy's keys of the blocks stored; None when the parent is unknown (a block whose
        prefix the proxy never saw stored: its key cannot be made)."""
        if event.parent is None:
            after = seed(self.model)
        elif (parent := self.blocks.get(event.parent)) is not None:
            after = parent[0]
        else:
            return None
        sums, keys = extend(after, event.token_ids, event.block_size)
        for h, value, key in zip(event.hashes, sums, keys, strict=True):
            self.blocks[h] = (value, key)
            self.blocks.move_to_end(h)
        while len(self.blocks) > self.entries:
            self.blocks.popitem(last=False)
        return keys

    def removed(self, event: Removed) -> list[int]:
        """The proxy's keys of the blocks removed. Their mapping stays: vLLM's hash names a
        block's content (its prefix and tokens), so a block stored again, or after one of
        these, is the same key."""
        return [found[1] for h in event.hashes if (found := self.blocks.get(h)) is not None]
