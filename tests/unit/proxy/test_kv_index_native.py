"""The index in C (csrc/kv_index.cpp, `ucmctl.proxy._kv`) against the Python one it stands in
for: any sequence of routed, evicted and restarted instances' blocks, the bound reached or not,
gives the same leading counts, the same size, and the same blocks evicted first (8 instances: a
block held by more than the 5 a slot keeps inline); the keys it keeps in C read as the ints they
are."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ucmctl.proxy import kv_index
from ucmctl.proxy.kv_index import KvIndex, NativeKvIndex, block_keys, ids_keys
from ucmctl.proxy.pool import Instance
from ucmctl.proxy.rewrite import COMPLETIONS

pytestmark = pytest.mark.skipif(kv_index._native is None, reason="the native module is not built")

# prompts over a small alphabet of blocks, so that they share prefixes and collide in the index
PROMPTS = st.lists(st.integers(0, 3), min_size=0, max_size=9)
Op = tuple[str, int, list[int], bool]  # what, which instance, which prompt, saved (or all asked)
WHAT = st.sampled_from(["took", "took", "lost", "restart", "ask"])
OPS = st.lists(st.tuples(WHAT, st.integers(0, 7), PROMPTS, st.booleans()), max_size=80)


def _keys(prompt: list[int]) -> list[int]:
    ids = [t for b in prompt for t in [b] * 4]  # a block of 4 ids a letter
    return list(ids_keys(ids, "m", 4))


@settings(max_examples=300, deadline=None)
@given(ops=OPS, entries=st.integers(1, 24))
def test_the_index_in_c_answers_as_the_python_one(ops: list[Op], entries: int) -> None:
    py, c = KvIndex(entries), NativeKvIndex(entries)
    insts = [Instance(f"http://h{i}:1", "mixed") for i in range(8)]
    for op, who, prompt, flag in ops:
        keys, inst = _keys(prompt), insts[who]
        if op == "took":
            py.took(keys, inst, saved=flag)
            c.took(keys, inst, saved=flag)
        elif op == "lost":
            py.lost(keys, inst)
            c.lost(keys, inst)
        elif op == "restart":
            inst.epoch += 1
        asked = insts if flag else insts[who:]
        assert c.leading(keys, asked) == py.leading(keys, asked)
        assert len(c) == len(py)
    # the same blocks left, so the same evicted first: every prefix asked of both
    for prompt in ([a, b] for a in range(4) for b in range(4)):
        assert c.leading(_keys(prompt), insts) == py.leading(_keys(prompt), insts)


def test_keys_kept_in_c_read_as_their_ints() -> None:
    ids = list(range(16 * 5 + 3))
    keys = block_keys({"model": "m", "prompt": ids}, COMPLETIONS, 16)
    assert isinstance(keys, kv_index._native.Keys)
    ints = list(keys)
    assert len(keys) == 5 and all(isinstance(k, int) and 0 <= k < 2**64 for k in ints)
    assert [keys[i] for i in range(-5, 5)] == ints[-5:] + ints
    assert list(keys[1:4]) == ints[1:4] and list(keys[::-2]) == ints[::-2] and list(keys[:0]) == []
    assert keys == tuple(ints) and keys != tuple(ints[:4]) and keys != (*ints[:4], ints[4] ^ 1)
    assert keys == ids_keys(ids, "m", 16) and hash(keys) == hash(ids_keys(ids, "m", 16))
    assert bool(keys) and not ids_keys(ids[:15], "m", 16)
    with pytest.raises(IndexError):
        keys[5]
    # the index reads them in C and as ints alike
    index, inst = NativeKvIndex(), Instance("http://a:1", "mixed")
    index.took(keys[:3], inst, saved=True)
    assert index.leading(keys, [inst]) == index.leading(ints, [inst]) == ([3], 3)


def test_a_block_held_by_more_instances_than_a_slot_keeps_inline() -> None:
    """Eight holders of one block (5 inline, 3 spilled): each one lost, in either part, and one
    taken again in a new epoch, as the Python index says."""
    py, c = KvIndex(), NativeKvIndex()
    insts = [Instance(f"http://h{i}:1", "mixed") for i in range(8)]
    keys = _keys([1, 2, 3])
    for n, inst in enumerate(insts):
        py.took(keys[: 1 + n % 3], inst, saved=False)
        c.took(keys[: 1 + n % 3], inst, saved=False)
    assert c.leading(keys, insts) == py.leading(keys, insts) == ([1, 2, 3, 1, 2, 3, 1, 2], 0)
    for lost, again in ((insts[6], None), (insts[0], insts[6]), (insts[7], None), (insts[2], insts[2])):
        py.lost(keys, lost)
        c.lost(keys, lost)
        if again is not None:
            again.epoch += 1
            py.took(keys[:2], again, saved=True)
            c.took(keys[:2], again, saved=True)
        assert c.leading(keys, insts) == py.leading(keys, insts)
    assert c.leading(keys, insts) == ([0, 2, 2, 1, 2, 3, 2, 0], 2)
