"""Store keys: a fixed-size digest of (namespace, vLLM block hash).

The namespace holds everything that makes KV bytes incompatible between two instances, so
two instances share a block only when its bytes would be identical. The scheduler writes
rank-free *block keys* into the step metadata (one metadata serves every worker); each
tensor-parallel rank turns them into its own *store keys*. With MLA every rank holds the
same KV, so all ranks share rank 0's key and only rank 0 writes it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

KEY_SIZE = 16  # ucm_store.KEY_SIZE; repeated so the scheduler math needs no native import


@dataclass(frozen=True)
class Namespace:
    """What a stored block's bytes depend on besides the tokens."""

    model: str
    dtype: str
    layout: str
    block_size: int
    tp_size: int
    num_layers: int
    shard_bytes: int
    mla: bool = False
    layerwise: bool = False

    def digest(self) -> bytes:
        # Field names are part of the encoding so a reordered or added field never aliases.
        text = (
            f"ucm-v1|model={self.model}|dtype={self.dtype}|layout={self.layout}"
            f"|block={self.block_size}|tp={self.tp_size}|mla={int(self.mla)}"
            f"|layers={self.num_layers}|shard={self.shard_bytes}|layerwise={int(self.layerwise)}"
        )
        return hashlib.blake2b(text.encode(), digest_size=32).digest()

    def writer(self, tp_rank: int) -> bool:
        """Whether this rank dumps blocks: with MLA only rank 0 writes the shared key."""
        return not self.mla or tp_rank == 0


def _digest(data: bytes) -> bytes:
    return hashlib.blake2b(data, digest_size=KEY_SIZE).digest()


class KeyMaker:
    """Turns vLLM's chained block hashes into block keys and store keys for one namespace."""

    def __init__(self, namespace: Namespace, hashes_per_block: int = 1) -> None:
        if hashes_per_block < 1:
            raise ValueError("hashes_per_block must be >= 1")
        self.namespace = namespace
        self._ns = namespace.digest()
        # vLLM may hash at a finer granularity than its block size; the hash at a block's
        # last boundary fingerprints the whole prefix up to that block, so it is the key.
        self._ratio = hashes_per_block

    def num_full_blocks(self, block_hashes: Sequence[bytes]) -> int:
        return len(block_hashes) // self._ratio

    def keys(self, block_hashes: Sequence[bytes], start: int = 0, stop: int | None = None) -> list[bytes]:
        """Block keys of blocks [start, stop) of a request whose hashes are `block_hashes`."""
        n = self.num_full_blocks(block_hashes)
        stop = n if stop is None else min(stop, n)
        r = self._ratio
        return [_digest(self._ns + bytes(block_hashes[(i + 1) * r - 1])) for i in range(start, stop)]

    def store_keys(self, block_keys: Sequence[bytes], tp_rank: int, layer: int | None = None) -> list[bytes]:
        """The keys one rank reads and writes (one layer of them in layerwise mode)."""
        ns = self.namespace
        keys = list(block_keys)
        if not ns.mla and ns.tp_size > 1:
            tag = f"|tp{tp_rank}".encode()
            keys = [_digest(k + tag) for k in keys]
        if ns.layerwise:
            if layer is None:
                raise ValueError("layerwise keys need a layer index")
            tag = f"|layer{layer}".encode()
            keys = [_digest(k + tag) for k in keys]
        return keys

    def presence_keys(self, block_keys: Sequence[bytes]) -> list[bytes]:
        """Every store key that must exist for the blocks to be loadable, grouped per block.

        Returned flat, `len(block_keys) * self.keys_per_block` long, block-major.
        """
        ns = self.namespace
        ranks = [0] if ns.mla else list(range(ns.tp_size))
        layers: list[int | None] = list(range(ns.num_layers)) if ns.layerwise else [None]
        per_combo = [self.store_keys(block_keys, r, li) for r in ranks for li in layers]
        return [combo[i] for i in range(len(block_keys)) for combo in per_combo]

    @property
    def keys_per_block(self) -> int:
        ns = self.namespace
        return (1 if ns.mla else ns.tp_size) * (ns.num_layers if ns.layerwise else 1)
