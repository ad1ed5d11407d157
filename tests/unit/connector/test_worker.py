"""Worker side: whole blocks round-trip byte-exactly; store failures become load errors."""

from __future__ import annotations

import logging
import time

import pytest
import torch
import ucm_connector.worker as worker_module
from ucm_connector.copy_path import HostCopyBackend, KVLayout, StagedCopyBackend, make_copy_backend
from ucm_connector.keys import KeyMaker, Namespace
from ucm_connector.metadata import BlockTransfer, UCMConnectorMetadata
from ucm_connector.worker import LOGGER_NAME, WorkerSide

from tests.support.processes import wait_for
from tests.unit.connector.store_double import FakeStore

LAYERS, BLOCKS, HEADS, BS, HD = 3, 16, 2, 8, 4


def kv_caches() -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    # The CPU backend's shape: one view per layer of one storage, layer outermost,
    # [num_blocks, num_kv_heads, block_size, 2 * head_dim].
    storage = torch.randn(LAYERS, BLOCKS, HEADS, BS, 2 * HD).to(torch.bfloat16)
    return storage, {f"model.layers.{i}.self_attn.attn": storage[i] for i in range(LAYERS)}


def make(layerwise: bool = False, store: FakeStore | None = None, tp_rank: int = 0, worker_kw=None, **ns_kw):
    storage, caches = kv_caches()
    shard = HEADS * BS * 2 * HD * 2
    ns = Namespace(
        model="m",
        dtype="bfloat16",
        layout="cpu/LBHNC",
        block_size=BS,
        tp_size=1,
        num_layers=LAYERS,
        shard_bytes=shard,
        layerwise=layerwise,
        **ns_kw,
    )
    km = KeyMaker(ns)
    opened: list[FakeStore] = []

    def open_store(sizes: list[int]) -> FakeStore:
        s = store or FakeStore(sizes)
        s.shard_sizes = sizes
        opened.append(s)
        return s

    w = WorkerSide(open_store, km, tp_rank=tp_rank, **(worker_kw or {}))
    w.register_kv_caches(caches, list(caches), expected_shard_bytes=shard)
    return w, storage, km, opened[0]


def hashes(n: int) -> list[bytes]:
    return [bytes([i + 1]) * 32 for i in range(n)]


@pytest.mark.parametrize("layerwise", [False, True])
def test_blocks_round_trip_byte_exact(layerwise: bool) -> None:
    w, storage, km, store = make(layerwise)
    keys = km.keys(hashes(4))
    original = storage.clone()
    save = UCMConnectorMetadata(saves=[BlockTransfer("a", keys, [1, 2, 3, 4])])
    for name in [f"model.layers.{i}.self_attn.attn" for i in range(LAYERS)]:
        w.save_layer(name, save)  # no-op unless layerwise
    w.wait_for_save(save)
    assert len(store.blocks) == (4 * LAYERS if layerwise else 4)

    storage[:, 8:12] = 0
    load = UCMConnectorMetadata(loads=[BlockTransfer("b", keys, [8, 9, 10, 11])])
    w.start_load(load)
    for name in [f"model.layers.{i}.self_attn.attn" for i in range(LAYERS)]:
        w.wait_for_layer_load(name)
    w.wait_for_save(load)
    assert w.take_load_errors() == set()
    assert torch.equal(storage[:, 8:12], original[:, 1:5])  # every layer, K and V rows
    assert torch.equal(storage[:, :8], original[:, :8])  # nothing else touched
    stats = w.take_stats()
    assert stats is not None and stats.data["load_blocks"] == 4 and stats.data["save_blocks"] == 4


def test_corrupt_and_missing_blocks_are_load_errors_and_logged(caplog) -> None:
    w, storage, km, store = make()
    keys = km.keys(hashes(3))
    w.wait_for_save(UCMConnectorMetadata(saves=[BlockTransfer("a", keys[:2], [1, 2])]))
    store.corrupt.add(keys[1])
    with caplog.at_level(logging.WARNING, logger=LOGGER_NAME):
        w.start_load(UCMConnectorMetadata(loads=[BlockTransfer("b", keys, [5, 6, 7])]))
    assert w.take_load_errors() == {6, 7}
    assert w.take_load_errors() == set()  # reported once
    assert torch.equal(storage[:, 5], storage[:, 1])
    msgs = [r.getMessage() for r in caplog.records]
    assert any("UCM load error: request_id: b, block 6: checksum mismatch" in m for m in msgs)
    stats = w.take_stats()
    assert stats is not None and stats.data["load_errors"] == 2 and stats.data["load_errors_corrupt"] == 1


def test_load_errors_are_counted_by_the_kind_a_network_filesystem_gives() -> None:
    from ucm_connector.stats import error_kind

    path = "/mnt/kv/244/244b"
    assert error_kind(f"cannot open {path}: Transport endpoint is not connected (errno 107)") == "enotconn"
    assert error_kind(f"cannot open {path}: Stale file handle (errno 116)") == "estale"
    assert error_kind(f"cannot read {path}: Input/output error (errno 5)") == "eio"
    assert error_kind("load wait failed: TimeoutError('task 3 not done')") == "timeout"
    assert error_kind(f"corrupt block, moved aside: {path}: payload checksum mismatch") == "corrupt"
    assert error_kind(f"cannot open {path}: Permission denied (errno 13)") is None
    assert error_kind("not found") is None


def test_store_exceptions_never_escape() -> None:
    store = FakeStore([0])
    w, _, km, store = make(store=store)
    keys = km.keys(hashes(2))
    store.fail_calls = True
    w.wait_for_save(UCMConnectorMetadata(saves=[BlockTransfer("a", keys, [1, 2])]))
    w.start_load(UCMConnectorMetadata(loads=[BlockTransfer("b", keys, [3, 4])]))
    assert w.take_load_errors() == {3, 4}
    stats = w.take_stats()
    assert stats is not None and stats.data["save_errors"] == 2 and stats.data["load_errors"] == 2


def test_same_block_completed_by_two_requests_is_dumped_once() -> None:
    w, _, km, store = make()
    keys = km.keys(hashes(1))
    w.wait_for_save(
        UCMConnectorMetadata(saves=[BlockTransfer("a", keys, [1]), BlockTransfer("b", keys, [2])])
    )
    assert [c for c in store.calls if c[0] == "dump"] == [("dump", keys)]


def test_mla_non_zero_rank_never_writes() -> None:
    w, _, km, store = make(tp_rank=1, mla=True)
    w.wait_for_save(UCMConnectorMetadata(saves=[BlockTransfer("a", km.keys(hashes(1)), [1])]))
    assert store.blocks == {}


def test_shard_size_mismatch_is_a_startup_error() -> None:
    _, caches = kv_caches()
    ns = Namespace(
        model="m", dtype="bfloat16", layout="x", block_size=BS, tp_size=1, num_layers=LAYERS, shard_bytes=1
    )
    w = WorkerSide(lambda sizes: FakeStore(sizes), KeyMaker(ns))
    with pytest.raises(RuntimeError, match="bytes per block and layer"):
        w.register_kv_caches(caches, list(caches), expected_shard_bytes=1)


def test_copy_backend_choice_and_staged_path_on_host() -> None:
    _storage, caches = kv_caches()
    layout = KVLayout.from_kv_caches(caches, list(caches))
    assert isinstance(make_copy_backend(layout, True), HostCopyBackend)
    # A layout whose blocks are not contiguous per layer (K and V planes apart) is staged.
    split = torch.randn(LAYERS, 2, BLOCKS, HEADS, BS, HD).to(torch.bfloat16)
    split_caches = {f"l{i}": split[i].transpose(0, 1) for i in range(LAYERS)}
    split_layout = KVLayout.from_kv_caches(split_caches, list(split_caches))
    staged = make_copy_backend(split_layout, True)
    assert isinstance(staged, StagedCopyBackend)
    original = split.clone()
    store = FakeStore([split_layout.shard_bytes] * LAYERS)
    keys = [bytes([i]) * 16 for i in range(2)]
    store.wait(store.dump(keys, staged.dump_sources([3, 4])))
    split[:, :, 9:11] = 0
    store.wait(store.load(keys, staged.load_targets([9, 10])))
    staged.finish_load([9, 10])
    assert torch.equal(split[:, :, 9:11], original[:, :, 3:5])


def test_wait_persisted_finishes_a_step_only_when_blocks_are_on_disk(tmp_path) -> None:
    """Disaggregated PD: the prefill side must not answer before decode can find its blocks."""
    import ucm_store

    cfg = {
        "store_pipeline": "Cache|Posix",
        "storage_backends": str(tmp_path),
        "cache_buffer_capacity_gb": 0.01,
    }
    _, caches = kv_caches()
    shard = HEADS * BS * 2 * HD * 2
    ns = Namespace(model="m", dtype="bfloat16", layout="cpu/LBHNC", block_size=BS, tp_size=1,
                   num_layers=LAYERS, shard_bytes=shard)  # fmt: skip
    km = KeyMaker(ns)
    w = WorkerSide(lambda sizes: ucm_store.Store.from_config(cfg, shard_sizes=sizes), km, wait_persisted=True)
    w.register_kv_caches(caches, list(caches), expected_shard_bytes=shard)
    keys = km.keys(hashes(6))
    w.wait_for_save(UCMConnectorMetadata(saves=[BlockTransfer("a", keys, [1, 2, 3, 4, 5, 6])]))
    # Another process's view: the files alone, looked up at once, with no wait.
    with ucm_store.Store.from_config({"store_pipeline": "Posix", "storage_backends": str(tmp_path)},
                                     shard_sizes=[shard] * LAYERS) as disk:  # fmt: skip
        assert disk.lookup_prefix(km.store_keys(keys, 0, None)) == 6


def _real_worker(tmp_path, pipeline: str, **kw):
    import ucm_store

    cfg = {"store_pipeline": pipeline, "storage_backends": str(tmp_path), "cache_buffer_capacity_gb": 0.01}
    storage, caches = kv_caches()
    shard = HEADS * BS * 2 * HD * 2
    ns = Namespace(model="m", dtype="bfloat16", layout="cpu/LBHNC", block_size=BS, tp_size=1,
                   num_layers=LAYERS, shard_bytes=shard)  # fmt: skip
    km = KeyMaker(ns)
    w = WorkerSide(lambda sizes: ucm_store.Store.from_config(cfg, shard_sizes=sizes), km, **kw)
    w.register_kv_caches(caches, list(caches), expected_shard_bytes=shard)
    return w, storage, km


def test_a_load_past_its_bound_is_recomputed_and_its_late_read_never_lands_in_the_reused_block(
    tmp_path,
) -> None:
    """The CPU path reads straight into the paged cache: a read stuck in a stalled mount that
    returns after the step gave up must not write the block vLLM has handed to another request."""
    from ucm_store import _native

    writer, storage, km = _real_worker(tmp_path, "Posix")
    keys = km.keys(hashes(2))
    writer.wait_for_save(UCMConnectorMetadata(saves=[BlockTransfer("a", keys, [1, 2])]))
    writer.close()
    reader, rstorage, _ = _real_worker(tmp_path, "Posix", load_timeout_s=0.3)
    _native._inject_stall("posix_read", 2, 1200)  # both reads wait 1.2 s, then complete
    try:
        t0 = time.perf_counter()
        reader.start_load(UCMConnectorMetadata(loads=[BlockTransfer("b", keys, [7, 8])]))
        waited = time.perf_counter() - t0
        # no read back for half the bound is a stall: given up then, not at the bound
        assert 0.12 <= waited < 1.0, f"the step waited {waited:.2f} s for a 0.15 s stall, 0.3 s bound"
        assert reader.take_load_errors() == {7, 8}
        stats = reader.take_stats()
        assert stats is not None and stats.data["load_errors_timeout"] == 2
        # vLLM recomputes, then gives blocks 7 and 8 to other requests: their own KV goes there.
        rstorage[:, 7:9] = 3.0
        assert reader._store is not None
        assert wait_for(lambda: reader._store.stats()["load_late"] == 2), reader._store.stats()  # returned
        assert torch.all(rstorage[:, 7:9] == 3.0), "a late read overwrote a reused KV block"
        # The storage answers again: the same blocks load, byte-exact.
        reader.start_load(UCMConnectorMetadata(loads=[BlockTransfer("c", keys, [9, 10])]))
        assert reader.take_load_errors() == set()
        assert torch.equal(rstorage[:, 9:11], storage[:, 1:3])
    finally:
        _native._inject_stall("posix_read", 0, 0)
        reader.close()


def test_a_dump_past_its_bound_is_a_counted_save_error_and_the_step_goes_on(tmp_path) -> None:
    from ucm_store import _native

    w, _, km = _real_worker(tmp_path, "Cache|Posix", wait_persisted=True, dump_timeout_s=0.3)
    _native._inject_stall("posix_write", 2, 1200)
    try:
        t0 = time.perf_counter()
        w.wait_for_save(UCMConnectorMetadata(saves=[BlockTransfer("a", km.keys(hashes(2)), [1, 2])]))
        waited = time.perf_counter() - t0
        assert 0.25 <= waited < 1.2, f"the step waited {waited:.2f} s for a 0.3 s bound"
        stats = w.take_stats()
        assert stats is not None and stats.data["save_errors"] == 2 and stats.data["save_blocks"] == 0
        assert stats.data["save_errors_timeout"] == 2
    finally:
        _native._inject_stall("posix_write", 0, 0)
        w.close()


class Clock:
    """The worker module's `time`, whose `perf_counter` moves only when a test says so."""

    def __init__(self) -> None:
        self.now = 1000.0

    def perf_counter(self) -> float:
        return self.now

    def __getattr__(self, name: str) -> object:
        return getattr(time, name)


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    fake = Clock()
    monkeypatch.setattr(worker_module, "time", fake)
    return fake


class SlowStore(FakeStore):
    """Every wait on a task returns `delay` s late (on `clock`), whatever its bound: a bounding bug."""

    def __init__(self, delay: float, clock: Clock) -> None:
        super().__init__([])  # make() sets the shard sizes the worker asks for
        self.delay = delay
        self.clock = clock

    def finish_within(self, tid: int, timeout: float, **how: object):
        self.clock.now += self.delay
        return super().finish_within(tid, timeout, **how)


@pytest.mark.parametrize("delay", [0.0, 1.5])
def test_a_store_wait_past_its_bound_by_over_a_second_is_counted(delay: float, clock: Clock) -> None:
    store = SlowStore(delay, clock)
    w, _, km, _ = make(store=store, worker_kw={"load_timeout_s": 0.2, "dump_timeout_s": 0.2})
    keys = km.keys(hashes(2))
    w.wait_for_save(UCMConnectorMetadata(saves=[BlockTransfer("a", keys, [1, 2])]))
    w.start_load(UCMConnectorMetadata(loads=[BlockTransfer("b", keys, [3, 4])]))
    stats = w.take_stats()
    assert stats is not None
    late = int(delay > 0.2 + 1.0)
    assert (stats.data["save_waits_over_bound"], stats.data["load_waits_over_bound"]) == (late, late)


def test_the_steps_own_compute_between_submission_and_wait_is_not_the_stores(clock: Clock) -> None:
    """Layerwise: a layer's load is submitted, the model computes (here 1.5 s, past the 0.2 s
    bound + 1 s), then waits: the wait returns at once, so nothing is over its bound."""
    w, _, km, _ = make(layerwise=True, worker_kw={"load_timeout_s": 0.2})
    keys = km.keys(hashes(2))
    save = UCMConnectorMetadata(saves=[BlockTransfer("a", keys, [1, 2])])
    for name in [f"model.layers.{i}.self_attn.attn" for i in range(LAYERS)]:
        w.save_layer(name, save)
    w.wait_for_save(save)
    w.start_load(UCMConnectorMetadata(loads=[BlockTransfer("b", keys, [3, 4])]))
    clock.now += 1.5
    for name in [f"model.layers.{i}.self_attn.attn" for i in range(LAYERS)]:
        w.wait_for_layer_load(name)
    stats = w.take_stats()
    assert stats is not None and stats.data["load_blocks"] == 2
    assert stats.data["load_waits_over_bound"] == 0


class BoundRecorder(FakeStore):
    """Records the bound and the stall bound each wait is given."""

    def __init__(self) -> None:
        super().__init__([])
        self.waits: list[tuple[str, float, object]] = []

    def finish_within(self, tid: int, timeout: float, **how: object):
        self.waits.append((str(how.get("op")), timeout, how.get("stall_s")))
        return super().finish_within(tid, timeout, **how)


@pytest.mark.parametrize("layerwise", [False, True])
def test_a_loads_bound_grows_with_its_bytes_and_a_stall_is_half_the_base_bound(
    layerwise: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A long prompt's healthy load is not given up as a stall would be: its bound is the base
    plus its bytes at the floor rate (0.1 GB/s; 1 KB/s here, for bytes this small to show);
    no block back for half the base bound ends it sooner."""
    from ucmctl.core import ucm_config

    assert ucm_config.load_bound(5.0, 4 << 30) == pytest.approx(5.0 + 42.95, abs=0.01)  # 4 GiB
    monkeypatch.setattr(ucm_config, "LOAD_FLOOR_BYTES_PER_S", 1000.0)
    store = BoundRecorder()
    w, _, km, _ = make(layerwise=layerwise, store=store, worker_kw={"load_timeout_s": 4.0})
    keys = km.keys(hashes(3))
    w.wait_for_save(UCMConnectorMetadata(saves=[BlockTransfer("a", keys, [1, 2, 3])]))
    store.waits.clear()
    w.start_load(UCMConnectorMetadata(loads=[BlockTransfer("b", keys, [4, 5, 6])]))
    for layer in range(LAYERS):
        w.wait_for_layer_load(f"model.layers.{layer}.self_attn.attn")
    per_task = 3 * HEADS * BS * 2 * HD * 2 * (1 if layerwise else LAYERS)  # blocks x shard x layers
    assert per_task in (768, 2304)
    # what is left of the bound when the wait begins (it counts from submission)
    assert [(op, stall) for op, _, stall in store.waits] == [("load", 2.0)] * (LAYERS if layerwise else 1)
    assert all(left == pytest.approx(4.0 + per_task / 1000.0, abs=0.1) for _, left, _ in store.waits), (
        store.waits
    )
