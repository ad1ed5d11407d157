"""Block keys from token ids, and the engine-local prefix cache (fixed capacity, LRU)."""

from __future__ import annotations

import hashlib
from array import array
from collections import OrderedDict
from collections.abc import Sequence

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

    def __init__(self, capacity_blocks: int, enabled: bool = True) -> None:
        self.capacity = max(0, capacity_blocks)
        self.enabled = enabled and self.capacity > 0
        self._blocks: OrderedDict[bytes, None] = OrderedDict()
        self.evictions = 0

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

    def insert(self, keys: Sequence[bytes]) -> None:
        if not self.enabled:
            return
        for key in keys:
            if key in self._blocks:
                self._blocks.move_to_end(key)
                continue
            self._blocks[key] = None
            self._evict()

    def resize(self, capacity: int) -> None:
        """A new capacity; the least recently used blocks beyond it go."""
        self.capacity = max(0, capacity)
        self._evict()

    def _evict(self) -> None:
        while len(self._blocks) > self.capacity:
            self._blocks.popitem(last=False)
            self.evictions += 1

    def reset(self) -> None:
        self._blocks.clear()
