"""What an unbounded prefix cache could serve of a workload: its reusable fraction, computed
from the workload's own token stream, the figure a measured hit rate is read against.

Engines cache whole blocks of `block_size` tokens, keyed by the chain of every block before
them (a block is reusable only when the whole prefix up to it is), and always compute the last
prompt token themselves. This tracker does the same: `add` caches the full blocks of a sequence
the engine has seen (a prompt when it is sent; the prompt and the answer, less its last token,
once answered), `reusable` says how many tokens of a new prompt those blocks cover.
"""

from __future__ import annotations

import hashlib
from array import array
from collections.abc import Sequence


class ReuseTracker:
    def __init__(self, block_size: int = 16) -> None:
        self.block_size = max(1, block_size)
        self._chains: set[bytes] = set()

    def _keys(self, tokens: Sequence[int]) -> list[bytes]:
        bs = self.block_size
        keys = []
        parent = b""
        for start in range(0, len(tokens) - bs + 1, bs):
            parent = hashlib.blake2b(
                parent + array("q", tokens[start : start + bs]).tobytes(), digest_size=16
            ).digest()
            keys.append(parent)
        return keys

    def reusable(self, prompt: Sequence[int]) -> int:
        """Tokens of `prompt` an unbounded cache of everything added so far would serve."""
        usable = (len(prompt) - 1) // self.block_size  # the last token is always computed
        n = 0
        for key in self._keys(prompt)[:usable]:
            if key not in self._chains:
                break
            n += 1
        return n * self.block_size

    def add(self, tokens: Sequence[int]) -> None:
        self._chains.update(self._keys(tokens))
