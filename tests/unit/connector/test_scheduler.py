"""Scheduler side: lookups beyond the local hit, load/save metadata across steps, failures."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest
from ucm_connector.keys import KeyMaker, Namespace
from ucm_connector.scheduler import LOGGER_NAME, SchedulerSide

from tests.unit.connector.store_double import FakeStore

BS = 4
NS = Namespace(
    model="m", dtype="bfloat16", layout="cpu/LBHNC", block_size=BS, tp_size=1, num_layers=2, shard_bytes=8
)


def request(req_id: str, num_tokens: int) -> SimpleNamespace:
    # vLLM hashes full blocks only; fake chained hashes by prefix length.
    hashes = [f"h{i}".encode() * 4 for i in range(num_tokens // BS)]
    return SimpleNamespace(request_id=req_id, num_tokens=num_tokens, block_hashes=hashes)


def blocks(ids: list[int]) -> SimpleNamespace:
    return SimpleNamespace(get_block_ids=lambda: (list(ids),))


def new_req(req_id: str, ids: list[int], computed: int) -> SimpleNamespace:
    return SimpleNamespace(req_id=req_id, block_ids=(list(ids),), num_computed_tokens=computed)


def step(new=(), cached=(), scheduled=None) -> SimpleNamespace:
    cached = list(cached)
    return SimpleNamespace(
        scheduled_new_reqs=list(new),
        scheduled_cached_reqs=SimpleNamespace(
            req_ids=[c[0] for c in cached],
            resumed_req_ids={c[0] for c in cached if c[3]},
            new_block_ids=[c[1] for c in cached],
            num_computed_tokens=[c[2] for c in cached],
        ),
        num_scheduled_tokens=dict(scheduled or {}),
    )


@pytest.fixture
def km() -> KeyMaker:
    return KeyMaker(NS)


def seed(store: FakeStore, km: KeyMaker, req: SimpleNamespace, nblocks: int) -> None:
    for k in km.keys(req.block_hashes, 0, nblocks):
        store.blocks[k] = b"x" * 16


def test_hit_beyond_local_is_capped_below_prompt_and_logged_once(km: KeyMaker, caplog) -> None:
    store = FakeStore([8, 8])
    req = request("r1", 16)  # 4 full blocks; at most (16-1)//4 = 3 may be loaded
    seed(store, km, req, 4)
    side = SchedulerSide(store, km, BS)
    with caplog.at_level(logging.INFO, logger=LOGGER_NAME):
        assert side.get_num_new_matched_tokens(req, 4) == (8, False)  # blocks 1, 2
        assert side.get_num_new_matched_tokens(req, 4) == (8, False)
    lines = [r.getMessage() for r in caplog.records if "total_blocks_num" in r.getMessage()]
    assert lines == ["request_id: r1, total_blocks_num: 4, hit hbm: 1, hit external: 2"]


def test_external_hit_stops_at_first_missing_block(km: KeyMaker) -> None:
    store = FakeStore([8, 8])
    req = request("r1", 33)
    seed(store, km, req, 8)
    del store.blocks[km.keys(req.block_hashes)[3]]
    side = SchedulerSide(store, km, BS)
    assert side.get_num_new_matched_tokens(req, 0) == (12, False)


def test_load_metadata_uses_allocated_blocks_after_local_hit(km: KeyMaker) -> None:
    store = FakeStore([8, 8])
    req = request("r1", 17)
    seed(store, km, req, 4)
    side = SchedulerSide(store, km, BS)
    tokens, _ = side.get_num_new_matched_tokens(req, 4)
    assert tokens == 12
    side.update_state_after_alloc(req, blocks([7, 8, 9, 10, 11]), tokens)
    meta = side.build_connector_meta(step(new=[new_req("r1", [7, 8, 9, 10, 11], 16)], scheduled={"r1": 1}))
    assert len(meta.loads) == 1
    assert meta.loads[0].block_ids == [8, 9, 10]
    assert meta.loads[0].keys == km.keys(req.block_hashes, 1, 4)
    assert meta.saves == []  # every full block is already in the store
    assert side.external_hit_tokens == 12
    # the load is handed out once
    meta2 = side.build_connector_meta(step(cached=[("r1", None, 17, False)], scheduled={"r1": 1}))
    assert meta2.loads == [] and meta2.saves == []


def test_vllm_granting_fewer_tokens_shrinks_the_load(km: KeyMaker) -> None:
    store = FakeStore([8, 8])
    req = request("r1", 17)
    seed(store, km, req, 4)
    side = SchedulerSide(store, km, BS)
    side.get_num_new_matched_tokens(req, 0)
    side.update_state_after_alloc(req, blocks([1, 2, 3, 4, 5]), 0)
    meta = side.build_connector_meta(step(new=[new_req("r1", [1, 2, 3, 4, 5], 0)], scheduled={"r1": 17}))
    assert meta.loads == []
    assert side.external_hit_tokens == 0


def test_chunked_prefill_saves_each_full_block_once(km: KeyMaker) -> None:
    store = FakeStore([8, 8])
    req = request("r1", 20)  # 5 full blocks
    side = SchedulerSide(store, km, BS)
    assert side.get_num_new_matched_tokens(req, 0) == (0, False)
    side.update_state_after_alloc(req, blocks([10, 11, 12]), 0)
    keys = km.keys(req.block_hashes)
    m1 = side.build_connector_meta(step(new=[new_req("r1", [10, 11, 12], 0)], scheduled={"r1": 10}))
    assert [(s.keys, s.block_ids) for s in m1.saves] == [(keys[:2], [10, 11])]
    m2 = side.build_connector_meta(step(cached=[("r1", ([13, 14],), 10, False)], scheduled={"r1": 10}))
    assert [(s.keys, s.block_ids) for s in m2.saves] == [(keys[2:5], [12, 13, 14])]
    m3 = side.build_connector_meta(step(cached=[("r1", None, 20, False)], scheduled={"r1": 1}))
    assert m3.saves == []


def test_blocks_without_hash_yet_are_saved_later(km: KeyMaker) -> None:
    store = FakeStore([8, 8])
    req = request("r1", 8)
    side = SchedulerSide(store, km, BS)
    side.get_num_new_matched_tokens(req, 0)
    side.update_state_after_alloc(req, blocks([1, 2, 3]), 0)
    m1 = side.build_connector_meta(step(new=[new_req("r1", [1, 2, 3], 0)], scheduled={"r1": 8}))
    assert [s.block_ids for s in m1.saves] == [[1, 2]]
    # decode: tokens 8..11 computed, but vLLM has not hashed block 2 yet (async scheduling)
    m2 = side.build_connector_meta(step(cached=[("r1", None, 11, False)], scheduled={"r1": 1}))
    assert m2.saves == []
    req.block_hashes.append(b"h2" * 4)
    req.num_tokens = 13
    m3 = side.build_connector_meta(step(cached=[("r1", None, 12, False)], scheduled={"r1": 1}))
    assert [(s.keys, s.block_ids) for s in m3.saves] == [(km.keys(req.block_hashes, 2, 3), [3])]


def test_preempted_request_resumes_with_new_blocks(km: KeyMaker) -> None:
    store = FakeStore([8, 8])
    req = request("r1", 12)
    side = SchedulerSide(store, km, BS)
    side.get_num_new_matched_tokens(req, 0)
    side.update_state_after_alloc(req, blocks([1, 2, 3]), 0)
    m1 = side.build_connector_meta(step(new=[new_req("r1", [1, 2, 3], 0)], scheduled={"r1": 4}))
    assert [s.block_ids for s in m1.saves] == [[1]]
    seed(store, km, req, 1)  # block 0 persisted meanwhile
    # preempted, then rescheduled: vLLM asks again and hands the whole block list
    assert side.get_num_new_matched_tokens(req, 0) == (4, False)
    side.update_state_after_alloc(req, blocks([5, 6, 7]), 4)
    m2 = side.build_connector_meta(step(cached=[("r1", ([5, 6, 7],), 4, True)], scheduled={"r1": 8}))
    assert [(s.block_ids) for s in m2.loads] == [[5]]
    assert [(s.block_ids) for s in m2.saves] == [[6, 7]]


def test_lookup_failure_is_a_miss_not_an_error(km: KeyMaker) -> None:
    store = FakeStore([8, 8], fail_lookup=True)
    req = request("r1", 16)
    side = SchedulerSide(store, km, BS)
    assert side.get_num_new_matched_tokens(req, 0) == (0, False)


def test_load_error_makes_the_block_saved_again_after_recompute(km: KeyMaker) -> None:
    store = FakeStore([8, 8])
    req = request("r1", 17)
    seed(store, km, req, 4)
    side = SchedulerSide(store, km, BS)
    side.get_num_new_matched_tokens(req, 0)
    side.update_state_after_alloc(req, blocks([1, 2, 3, 4, 5]), 16)
    m1 = side.build_connector_meta(step(new=[new_req("r1", [1, 2, 3, 4, 5], 16)], scheduled={"r1": 1}))
    assert m1.loads[0].block_ids == [1, 2, 3, 4]
    side.on_load_errors({2})
    m2 = side.build_connector_meta(step(cached=[("r1", None, 4, False)], scheduled={"r1": 13}))
    assert [(s.keys, s.block_ids) for s in m2.saves] == [(km.keys(req.block_hashes, 1, 2), [2])]


def test_non_writer_rank_plans_no_saves(km: KeyMaker) -> None:
    side = SchedulerSide(FakeStore([8, 8]), km, BS, writes=False)
    req = request("r1", 8)
    side.get_num_new_matched_tokens(req, 0)
    side.update_state_after_alloc(req, blocks([1, 2]), 0)
    assert side.build_connector_meta(step(new=[new_req("r1", [1, 2], 0)], scheduled={"r1": 8})).saves == []


def test_finished_and_reset_forget_state(km: KeyMaker) -> None:
    store = FakeStore([8, 8])
    side = SchedulerSide(store, km, BS)
    req = request("r1", 8)
    side.get_num_new_matched_tokens(req, 0)
    side.update_state_after_alloc(req, blocks([1, 2]), 0)
    side.request_finished(req)
    assert side.build_connector_meta(step(cached=[("r1", None, 8, False)], scheduled={"r1": 1})).saves == []
    seed(store, km, req, 1)
    side.get_num_new_matched_tokens(req, 0)
    side.reset()
    store.blocks.clear()
    assert side.get_num_new_matched_tokens(req, 0) == (0, False)
