"""Block keys from token ids, and the engine-local prefix cache (fixed capacity, LRU), which
records what it gains and loses as vLLM's KV-cache events (its schema: sim/kv_events.py sends
them) when asked to."""

from __future__ import annotations

import hashlib
from array import array
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

KEY_SIZE = 16


def block_keys(tokens: Sequence[int], block_size: int, namespace: bytes) -> list[bytes]:
    """Chained 16-byte keys of the prompt's full blocks: a key names the whole prefix up to it."""
    keys: list[bytes] = []
    parent = hashlib.sha256(namespace).digest()[:KEY_SIZE]
    for start in range(0, len(tokens) - block_size + 1, block_size):
        chunk = array("q", tokens[start : start + block_size]).tobytes()
        parent = hashlib.sha256(parent + chunk).digest()[:KEY_SIZE]
        keys.append(parent)
    return keys


def extend_keys(keys: list[bytes], tokens: Sequence[int], block_size: int, namespace: bytes) -> None:
    """Append the keys of the full blocks of `tokens` past those `keys` already names (the
    blocks an answer fills: engines cache generated tokens' KV as they do the prompt's)."""
    parent = keys[-1] if keys else hashlib.sha256(namespace).digest()[:KEY_SIZE]
    for start in range(len(keys) * block_size, len(tokens) - block_size + 1, block_size):
        chunk = array("q", tokens[start : start + block_size]).tobytes()
        parent = hashlib.sha256(parent + chunk).digest()[:KEY_SIZE]
        keys.append(parent)


class PrefixCache:
    """The blocks an engine keeps in its own KV memory (vLLM's HBM prefix cache)."""

    def __init__(self, capacity_blocks: int, enabled: bool = True, block_size: int = 16) -> None:
        self.capacity = max(0, capacity_blocks)
        self.enabled = enabled and self.capacity > 0
        self.block_size = block_size
        self._blocks: OrderedDict[bytes, None] = OrderedDict()
        self.evictions = 0
        self.events: list[dict[str, Any]] | None = None  # a list: record vLLM's events there

    def __len__(self) -> int:
        return len(self._blocks)

    def match(self, keys: Sequence[bytes]) -> int:
        """Leading blocks present; they become the most recently used."""
        if not self.enabled:
            return 0
        n = 0
        for key in keys:
            if key not in self._blocks:
                break
            self._blocks.move_to_end(key)
            n += 1
        return n

    def insert(self, keys: Sequence[bytes], parent: bytes | None = None, tokens: Sequence[int] = ()) -> None:
        """Cache the blocks `keys` (after the block `parent`, holding `tokens`, a block's worth
        each: what an event of them names)."""
        if not self.enabled:
            return
        run: list[int] = []  # the positions of the new blocks in a row: one BlockStored
        for n, key in enumerate(keys):
            if key in self._blocks:
                self._blocks.move_to_end(key)
                self._stored(keys, run, parent, tokens)
                run = []
                continue
            self._blocks[key] = None
            run.append(n)
        self._stored(keys, run, parent, tokens)
        self._evict()

    def _stored(
        self, keys: Sequence[bytes], run: list[int], parent: bytes | None, tokens: Sequence[int]
    ) -> None:
        if self.events is None or not run:
            return
        first, size = run[0], self.block_size
        stored = {
            "type": "BlockStored",
            "block_hashes": [keys[n] for n in run],
            "parent_block_hash": keys[first - 1] if first else parent,
            "token_ids": list(tokens[first * size : (run[-1] + 1) * size]),
            "block_size": size,
        }
        self.events.append({**stored, "lora_id": None, "medium": "GPU", "lora_name": None})

    def resize(self, capacity: int) -> None:
        """A new capacity; the least recently used blocks beyond it go."""
        self.capacity = max(0, capacity)
        self._evict()

    def _evict(self) -> None:
        gone = []
        while len(self._blocks) > self.capacity:
            gone.append(self._blocks.popitem(last=False)[0])
            self.evictions += 1
        if gone and self.events is not None:
            self.events.append({"type": "BlockRemoved", "block_hashes": gone, "medium": "GPU"})

    def reset(self) -> None:
        self._blocks.clear()
        if self.events is not None:
            self.events.append({"type": "AllBlocksCleared"})
