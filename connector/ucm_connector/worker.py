"""Worker side: move whole blocks between vLLM's paged KV cache and the store.

Runs in the worker process. Loads finish before the forward that reads them; dumps finish
(the store holds the bytes in its DRAM tier, or on disk without one) before `wait_for_save`
returns, so vLLM never reuses a block whose bytes are still being copied out. Any store
failure becomes a load error that vLLM recomputes, never a failed request.

Both waits are bounded (`load_timeout_s`, grown by a load's bytes, and `dump_timeout_s` of the
UCM config; either ends sooner once no block has come back for half the load bound: the storage
stalled): what is not done by then is given up with `Store.cancel`, after which the store never
touches those KV blocks again, even when a read stuck in a stalled filesystem returns later. So a
storage outage costs a recompute per request, never a frozen server or a block overwritten after
vLLM gave it to another request.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from ucm_connector import LOGGER_NAME
from ucm_connector.compat import blocks_first
from ucm_connector.copy_path import CopyBackend, KVLayout, make_copy_backend
from ucm_connector.keys import KeyMaker
from ucm_connector.metadata import BlockTransfer, UCMConnectorMetadata
from ucm_connector.stats import UCMConnectorStats, error_kind
from ucm_connector.store import StoreLike
from ucmctl.core.store_errors import LOAD_KINDS, SAVE_KINDS, over_bound
from ucmctl.core.ucm_config import DEFAULT_DUMP_TIMEOUT_S, DEFAULT_LOAD_TIMEOUT_S, load_bound, stall_bound

logger = logging.getLogger(LOGGER_NAME)


@dataclass
class _Task:
    tid: int
    transfers: list[BlockTransfer]
    block_ids: list[int]
    layers: list[int] | None
    nbytes: int
    started: float


class WorkerSide:
    """The worker-role half of UCMConnector."""

    def __init__(
        self,
        open_store: Callable[[list[int]], StoreLike],
        keys: KeyMaker,
        tp_rank: int = 0,
        event_sync: bool = True,
        wait_persisted: bool = False,
        load_timeout_s: float = DEFAULT_LOAD_TIMEOUT_S,
        dump_timeout_s: float = DEFAULT_DUMP_TIMEOUT_S,
    ) -> None:
        self._open_store = open_store
        self._wait_persisted = wait_persisted
        self._load_timeout_s = load_timeout_s
        self._dump_timeout_s = dump_timeout_s
        self._keys = keys
        self._tp_rank = tp_rank
        self._layerwise = keys.namespace.layerwise
        self._event_sync = event_sync
        self._writes = keys.namespace.writer(tp_rank)
        self._store: StoreLike | None = None
        self._backend: CopyBackend | None = None
        self._layout: KVLayout | None = None
        self._load_errors: set[int] = set()
        self._layer_loads: dict[int, _Task] = {}
        self._layer_saves: list[_Task] = []
        self.stats = UCMConnectorStats()

    # ---- set-up -----------------------------------------------------------------------
    def register_kv_caches(
        self,
        kv_caches: dict[str, torch.Tensor],
        layer_order: Sequence[str],
        expected_shard_bytes: int | None = None,
    ) -> None:
        layout = KVLayout.from_kv_caches(blocks_first(kv_caches, expected_shard_bytes), layer_order)
        if expected_shard_bytes is not None and layout.shard_bytes != expected_shard_bytes:
            raise RuntimeError(
                f"UCMConnector: KV cache holds {layout.shard_bytes} bytes per block and layer, "
                f"but the KV cache spec says {expected_shard_bytes}; keys would not match"
            )
        self._layout = layout
        self._backend = make_copy_backend(layout, self._event_sync)
        shard_sizes = [layout.shard_bytes] if self._layerwise else [layout.shard_bytes] * layout.num_layers
        self._store = self._open_store(shard_sizes)
        logger.info(
            "UCMConnector worker: %d layers, %d bytes per block and layer, %s copy, %s mode",
            layout.num_layers,
            layout.shard_bytes,
            type(self._backend).__name__,
            "layerwise" if self._layerwise else "whole-block",
        )

    @property
    def ready(self) -> bool:
        return self._store is not None

    # ---- loads ------------------------------------------------------------------------
    def start_load(self, meta: UCMConnectorMetadata) -> None:
        if not meta.loads or self._store is None:
            return
        if self._layerwise:
            assert self._layout is not None
            for li in range(self._layout.num_layers):
                task = self._submit(meta.loads, "load", [li])
                if task is not None:
                    self._layer_loads[li] = task
            return
        task = self._submit(meta.loads, "load", None)
        if task is not None:
            self._finish(task, "load", load_bound(self._load_timeout_s, task.nbytes))

    def wait_for_layer_load(self, layer_name: str) -> None:
        if not self._layer_loads or self._layout is None:
            return
        try:
            li = self._layout.layer_index(layer_name)
        except ValueError:
            return
        task = self._layer_loads.pop(li, None)
        if task is not None:
            self._finish(task, "load", load_bound(self._load_timeout_s, task.nbytes))

    # ---- saves ------------------------------------------------------------------------
    def save_layer(self, layer_name: str, meta: UCMConnectorMetadata) -> None:
        if not self._layerwise or not meta.saves or self._store is None or not self._writes:
            return
        assert self._layout is not None
        try:
            li = self._layout.layer_index(layer_name)
        except ValueError:
            return
        task = self._submit(meta.saves, "dump", [li])
        if task is not None:
            self._layer_saves.append(task)

    def wait_for_save(self, meta: UCMConnectorMetadata | None) -> None:
        # Layer loads nobody waited for (a layer the model skipped) must still finish before
        # their blocks are used again; their failures are reported like any other.
        for li in list(self._layer_loads):
            task = self._layer_loads.pop(li)
            self._finish(task, "load", load_bound(self._load_timeout_s, task.nbytes))
        if self._layerwise:
            saves, self._layer_saves = self._layer_saves, []
            for task in saves:
                self._finish(task, "dump", self._dump_timeout_s)
            return
        if meta is None or not meta.saves or self._store is None or not self._writes:
            return
        task = self._submit(meta.saves, "dump", None)
        if task is not None:
            self._finish(task, "dump", self._dump_timeout_s)

    def take_load_errors(self) -> set[int]:
        errors, self._load_errors = self._load_errors, set()
        return errors

    # ---- the store calls ----------------------------------------------------------------
    def _keys_for(self, block_keys: list[bytes], layers: list[int] | None) -> list[bytes]:
        layer = layers[0] if layers is not None else None
        return self._keys.store_keys(block_keys, self._tp_rank, layer)

    def _store_packs(
        self, refs: list[tuple[bytes, int] | None], layers: list[int] | None
    ) -> list[tuple[bytes, int] | None] | None:
        """The scheduler's pack references (block keys) as this rank's (and layer's) store keys."""
        if not any(refs):
            return None
        heads = self._keys_for([r[0] for r in refs if r is not None], layers)
        it = iter(heads)
        return [(next(it), r[1]) if r is not None else None for r in refs]

    def _submit(self, transfers: list[BlockTransfer], op: str, layers: list[int] | None) -> _Task | None:
        assert self._store is not None and self._backend is not None and self._layout is not None
        keys: list[bytes] = []
        block_ids: list[int] = []
        refs: list[tuple[bytes, int] | None] = []
        seen: set[bytes] = set()
        for t in transfers:
            for j, (k, b) in enumerate(zip(t.keys, t.block_ids, strict=True)):
                # Two requests may complete the same block in one step; one dump is enough.
                if op == "dump" and k in seen:
                    continue
                seen.add(k)
                keys.append(k)
                block_ids.append(b)
                refs.append(t.packs[j] if t.packs is not None else None)
        if not keys:
            return None
        packs = self._store_packs(refs, layers)
        nlayers = 1 if layers is not None else self._layout.num_layers
        nbytes = len(keys) * nlayers * self._layout.shard_bytes
        started = time.perf_counter()
        try:
            store_keys = self._keys_for(keys, layers)
            if op == "load":
                shards = self._backend.load_targets(block_ids, layers)
                tid = (
                    self._store.load(store_keys, shards, packs=packs)
                    if packs
                    else self._store.load(store_keys, shards)
                )
            else:
                shards = self._backend.dump_sources(block_ids, layers)
                tid = (
                    self._store.dump(store_keys, shards, packs=packs)
                    if packs
                    else self._store.dump(store_keys, shards)
                )
        except Exception as exc:
            self._failed(op, transfers, block_ids, [f"{op} not submitted: {exc}"] * len(block_ids))
            return None
        return _Task(tid, transfers, block_ids, layers, nbytes, started)

    def _outcome(self, task: _Task, op: str, left: float) -> tuple[list[bool], list[str]]:
        """Per-block outcome of a task, within the `left` s of its bound; what is not done by
        then is given up (the store lets go of the KV blocks before this returns)."""
        assert self._store is not None
        res = self._store.finish_within(
            task.tid,
            left,
            op=op,
            persisted=op == "dump" and self._wait_persisted,
            # a load or persist with no block back for as long as a lookup may take is a stall:
            # the blocks are recomputed (decode would miss a persist's anyway) within that, not
            # at the whole bound
            stall_s=stall_bound(self._load_timeout_s),
        )
        return list(res.ok), list(res.errors)

    def _finish(self, task: _Task, op: str, timeout: float) -> None:
        assert self._store is not None and self._backend is not None
        waited_from = time.perf_counter()
        left = max(task.started + timeout - waited_from, 0.0)  # the bound counts from submission
        try:
            ok, errors = self._outcome(task, op, left)
            # A result of the wrong length is a store bug: count what is missing as failed.
            ok = (ok + [False] * len(task.block_ids))[: len(task.block_ids)]
        except Exception as exc:  # the store failed: give up on the whole task
            ok, errors = [False] * len(task.block_ids), [f"{op} wait failed: {exc!r}"] * len(task.block_ids)
        end = time.perf_counter()
        elapsed = end - task.started
        # the wait itself against what was left of the bound when it began (the step's own
        # compute between submission and wait is not the store's)
        if over_bound(end - waited_from, left):
            name = "load" if op == "load" else "save"
            logger.warning(
                "UCM %s wait took %.1f s, past the %.1f s left of its %.1f s bound",
                op,
                end - waited_from,
                left,
                timeout,
            )
            self.stats.add(**{f"{name}_waits_over_bound": 1})
        if op == "load":
            if any(ok):
                self._backend.finish_load(task.block_ids, task.layers)
        else:
            self._backend.release_dump()
        bad = [i for i, flag in enumerate(ok) if not flag]
        if bad:
            self._failed(
                op,
                task.transfers,
                [task.block_ids[i] for i in bad],
                [errors[i] if i < len(errors) and errors[i] else "failed" for i in bad],
            )
        done = len(ok) - len(bad)
        per_block = task.nbytes // max(len(task.block_ids), 1)
        # Layerwise tasks move one layer each: count a block once (on layer 0), bytes always.
        blocks = done if task.layers is None or task.layers == [0] else 0
        if op == "load":
            self.stats.add(load_bytes=done * per_block, load_s=elapsed, load_blocks=blocks)
        else:
            self.stats.add(save_bytes=done * per_block, save_s=elapsed, save_blocks=blocks)

    def _failed(
        self, op: str, transfers: list[BlockTransfer], block_ids: list[int], errors: list[str]
    ) -> None:
        owner = {b: t.req_id for t in transfers for b in t.block_ids}
        if op == "load":
            self._load_errors.update(block_ids)
            self.stats.add(load_errors=len(block_ids))
            for kind in filter(None, map(error_kind, errors)):
                if kind in LOAD_KINDS:
                    self.stats.add(**{f"load_errors_{kind}": 1})
            for b, err in zip(block_ids, errors, strict=True):
                logger.warning(
                    "UCM load error: request_id: %s, block %d: %s; the block will be recomputed",
                    owner.get(b, "?"),
                    b,
                    err,
                )
        else:
            self.stats.add(save_errors=len(block_ids))
            for kind in filter(None, map(error_kind, errors)):
                if kind in SAVE_KINDS:
                    self.stats.add(**{f"save_errors_{kind}": 1})
            logger.warning(
                "UCM save error: %d block(s) not stored (first: request_id %s: %s); "
                "they will be misses later",
                len(block_ids),
                owner.get(block_ids[0], "?"),
                errors[0],
            )

    def take_stats(self) -> UCMConnectorStats | None:
        if self.stats.is_empty():
            return None
        out, self.stats = self.stats, UCMConnectorStats()
        return out

    def close(self) -> None:
        if self._store is not None:
            try:
                self._store.flush(timeout=30.0)
            finally:
                self._store.close()
                self._store = None
