"""Which pack a block of a prompt is in, with `storage.pack_blocks` > 1 (csrc/README.md, "Packs").

Block p's pack holds blocks of the range p - p % N .. p - p % N + N - 1 only, and is named by the
first block it holds: the range's first, or, past where the prompt's chain forks from the chain
that wrote the range's pack, the first block after the fork (a tail pack). The store's
`pack_heads` finds them on disk at lookup time (per block: the position of the block that names
its pack); the connector's scheduler side and the simulator carry that to the loads and saves.
"""

from __future__ import annotations

from collections.abc import Sequence


def pack_head(p: int, per_pack: int, heads: Sequence[int]) -> int:
    """The position of the block that names block `p`'s pack: `heads[p]` as the lookup found
    it; past the blocks it looked up, in the range of the last of them, that block's pack (the
    prompt's blocks continue it); otherwise the first block of p's range."""
    if p < len(heads):
        return heads[p]
    if heads and (len(heads) - 1) // per_pack == p // per_pack:
        return heads[-1]
    return p - p % per_pack


def pack_refs(
    chain: Sequence[bytes], blocks: Sequence[int], per_pack: int, heads: Sequence[int]
) -> list[tuple[bytes, int]] | None:
    """Per block of `blocks` (positions in a prompt whose block keys from the first on are
    `chain`): the key of the block that names its pack and its index there; None without packs."""
    if per_pack <= 1:
        return None
    return [(chain[h], p - h) for p in blocks for h in [pack_head(p, per_pack, heads)]]
