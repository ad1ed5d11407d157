"""Keys: deterministic, 16 bytes, separated by everything that changes the KV bytes."""

from __future__ import annotations

import dataclasses

from ucm_connector.keys import KEY_SIZE, KeyMaker, Namespace

NS = Namespace(
    model="m",
    dtype="bfloat16",
    layout="cpu/LBHNC",
    block_size=128,
    tp_size=1,
    num_layers=4,
    shard_bytes=65536,
)
HASHES = [bytes([i]) * 32 for i in range(6)]


def test_keys_are_deterministic_fixed_size_and_distinct() -> None:
    a = KeyMaker(NS).keys(HASHES)
    b = KeyMaker(dataclasses.replace(NS)).keys(HASHES)
    assert a == b
    assert all(len(k) == KEY_SIZE for k in a)
    assert len(set(a)) == len(a)
    assert KeyMaker(NS).keys(HASHES, 2, 4) == a[2:4]
    assert KeyMaker(NS).keys(HASHES, 0, 99) == a


def test_namespace_fields_separate_keys() -> None:
    base = KeyMaker(NS).keys(HASHES)
    for change in (
        {"model": "other"},
        {"dtype": "float32"},
        {"layout": "cuda/LBHNC"},
        {"block_size": 16},
        {"tp_size": 2},
        {"num_layers": 5},
        {"shard_bytes": 1},
        {"layerwise": True},
        {"mla": True},
    ):
        assert KeyMaker(dataclasses.replace(NS, **change)).keys(HASHES) != base, change


def test_hash_granularity_finer_than_block_uses_last_hash_of_each_block() -> None:
    km = KeyMaker(NS, hashes_per_block=2)
    assert km.num_full_blocks(HASHES) == 3
    assert km.keys(HASHES) == [KeyMaker(NS).keys(HASHES)[i] for i in (1, 3, 5)]


def test_tp_ranks_get_their_own_store_keys_and_mla_shares_rank0() -> None:
    tp = KeyMaker(dataclasses.replace(NS, tp_size=2))
    bk = tp.keys(HASHES[:2])
    r0, r1 = tp.store_keys(bk, 0), tp.store_keys(bk, 1)
    assert r0 != r1 and r0 != bk
    assert tp.keys_per_block == 2
    assert tp.presence_keys(bk) == [r0[0], r1[0], r0[1], r1[1]]

    mla = KeyMaker(dataclasses.replace(NS, tp_size=2, mla=True))
    bk = mla.keys(HASHES[:2])
    assert mla.store_keys(bk, 0) == mla.store_keys(bk, 1) == bk
    assert mla.namespace.writer(0) and not mla.namespace.writer(1)
    assert mla.presence_keys(bk) == bk


def test_layerwise_presence_needs_every_layer() -> None:
    lw = KeyMaker(dataclasses.replace(NS, layerwise=True))
    bk = lw.keys(HASHES[:2])
    assert lw.keys_per_block == 4
    per_layer = [lw.store_keys(bk, 0, layer) for layer in range(4)]
    assert len({k for keys in per_layer for k in keys}) == 8
    assert lw.presence_keys(bk)[:4] == [per_layer[layer][0] for layer in range(4)]
