"""Deterministic test blocks: content derived from the key, so any reader can verify it."""

from __future__ import annotations

import hashlib

import numpy as np


def key(i: int, ns: str = "t") -> bytes:
    return hashlib.blake2b(f"{ns}:{i}".encode(), digest_size=16).digest()


def block(k: bytes, shard_sizes: list[int]) -> list[np.ndarray]:
    rng = np.random.default_rng(int.from_bytes(k[:8], "little"))
    return [rng.integers(0, 256, size=s, dtype=np.uint8) for s in shard_sizes]


def empty(shard_sizes: list[int], fill: int = 0) -> list[np.ndarray]:
    return [np.full(s, fill, dtype=np.uint8) for s in shard_sizes]


def same(a: list[np.ndarray], b: list[np.ndarray]) -> bool:
    return len(a) == len(b) and all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))
