"""Where the KV of a prompt's leading blocks is, as the proxy's own routing history says: in which
instances' own caches (HBM, or DRAM on the CPU) and whether in the shared store.

A prompt is cut into blocks of the servers' block size (token-id prompts exactly; a text prompt
by `CHARS_PER_TOKEN` characters a token, an estimate), each named by a digest chained over the
blocks before it and the model, so a block's key names its whole prefix, as vLLM's block
hashes do. When an instance computed or loaded a prompt, its blocks are in its cache; when a
prefill (or a mixed instance) computed it, the connector saved its blocks to the store. Both
are approximate: the index does not see an instance evict a block, nor the store refuse a
save; an instance that comes back into routing (it may have restarted) holds nothing of what
it held before (its `epoch`), and one added again at the same URL is another instance. The
index is bounded: the least recently used blocks go first.
"""

from __future__ import annotations

import array
import hashlib
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

from ucmctl.proxy.pool import Instance
from ucmctl.proxy.rewrite import CHARS_PER_TOKEN, prompt_of

ENTRIES = 262_144  # blocks remembered (a few tens of MiB at most)
Holder = tuple[int, int]  # an instance's uid and epoch


def block_keys(body: dict[str, Any], path: str, block_size: int) -> tuple[bytes, ...]:
    """The keys of the prompt's full blocks, each chained over the ones before and the model."""
    prompt = prompt_of(body, path)
    if isinstance(prompt, str):
        raw, step = prompt.encode(), block_size * CHARS_PER_TOKEN
    else:
        try:  # token ids as 8-byte integers, converted in C: a 32k-token prompt in well under 1 ms
            raw, step = array.array("q", prompt).tobytes(), block_size * 8
        except (OverflowError, TypeError):  # not ids a model has: no blocks to know of
            return ()
    view = memoryview(raw)
    key = hashlib.blake2b(str(body.get("model", "")).encode(), digest_size=16).digest()
    keys = []
    for start in range(0, len(raw) - step + 1, step):
        h = hashlib.blake2b(key, digest_size=16)
        h.update(view[start : start + step])
        key = h.digest()
        keys.append(key)
    return tuple(keys)


class KvIndex:
    def __init__(self, entries: int = ENTRIES) -> None:
        # block key -> (the instances that hold it, whether the store has it)
        self._blocks: OrderedDict[bytes, tuple[frozenset[Holder], bool]] = OrderedDict()
        self._entries = entries

    def __len__(self) -> int:
        return len(self._blocks)

    def held(self, keys: Sequence[bytes], inst: Instance) -> int:
        """How many leading blocks `inst` holds in its own cache."""
        me = (inst.uid, inst.epoch)
        n = 0
        for key in keys:
            entry = self._blocks.get(key)
            if entry is None or me not in entry[0]:
                break
            n += 1
        return n

    def stored(self, keys: Sequence[bytes]) -> int:
        """How many leading blocks the store holds."""
        n = 0
        for key in keys:
            entry = self._blocks.get(key)
            if entry is None or not entry[1]:
                break
            n += 1
        return n

    def took(self, keys: Sequence[bytes], inst: Instance, *, saved: bool) -> None:
        """`inst` computed or loaded these blocks (and, `saved`, the store has them now)."""
        me = (inst.uid, inst.epoch)
        for key in keys:
            holders, stored = self._blocks.pop(key, (frozenset(), False))
            # a holder from an earlier epoch of the same instance is gone
            kept = frozenset(h for h in holders if h[0] != inst.uid)
            self._blocks[key] = (kept | {me}, stored or saved)
        while len(self._blocks) > self._entries:
            self._blocks.popitem(last=False)
