"""Scheduler side: decide what to load from and save to the store, one step at a time.

Runs in the EngineCore process. It never touches KV bytes: it asks the store which blocks
exist and writes `UCMConnectorMetadata` for the worker side.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ucm_connector import LOGGER_NAME
from ucm_connector.keys import KeyMaker
from ucm_connector.metadata import BlockTransfer, UCMConnectorMetadata
from ucmctl.core.pack_heads import pack_refs
from ucmctl.core.store_errors import LookupErrorsSince, over_bound, time_left

if TYPE_CHECKING:
    from ucm_connector.store import StoreLike

logger = logging.getLogger(LOGGER_NAME)


@dataclass
class _RequestState:
    """What the scheduler side remembers about one running request."""

    request: Any
    # Which of the request's leading full blocks the store already holds (from the lookup).
    present: list[bool] = field(default_factory=list)
    block_ids: list[int] = field(default_factory=list)
    # Blocks below this index were already saved (or known present): never dumped again.
    saved_upto: int = 0
    local_blocks: int = 0
    external_blocks: int = 0
    pending_load: BlockTransfer | None = None
    # With packs: per block from the lookup, the block that names its pack (Store.pack_heads).
    pack_heads: list[int] = field(default_factory=list)


class SchedulerSide:
    """The scheduler-role half of UCMConnector."""

    def __init__(
        self,
        store: StoreLike,
        keys: KeyMaker,
        block_size: int,
        writes: bool = True,
        lookup_timeout_s: float | None = None,
        pack_blocks: int = 1,
    ) -> None:
        self._store = store
        # Blocks per pack file (ucm_config pack_blocks): block p of a prompt sits in a pack of
        # the blocks p - p % pack_blocks .. + pack_blocks - 1, named by the first of them, or
        # past where its chain forks from the one that wrote that pack, by the first block after
        # the fork (ucm_store.Store.pack_heads: the lookup finds which).
        self._pack_blocks = pack_blocks
        # The lookup runs in vLLM's scheduler loop: a stalled mount must cost one bounded wait
        # (then misses at once, see ucm_store), not a frozen server.
        self._lookup_timeout_s = lookup_timeout_s
        # Lookups the storage failed to answer (counted by the store, or timed out here), for
        # the connector's stats: a hit rate that collapses says why.
        self.lookup_errors: dict[str, int] = {}
        self._errors_since = LookupErrorsSince(self._store_stats)
        self._keys = keys
        self._block_size = block_size
        self._writes = writes
        self._reqs: dict[str, _RequestState] = {}
        self._logged: set[str] = set()
        # Lookups cached per request: vLLM may ask again for a request it could not schedule,
        # and the answer must not change between the ask and the allocation.
        self._lookups: dict[str, tuple[int, list[bool], int, list[int]]] = {}
        self.external_hit_tokens = 0  # connector's own count, compared with vLLM's counter

    # ---- lookup -----------------------------------------------------------------------
    def get_num_new_matched_tokens(self, request: Any, num_computed_tokens: int) -> tuple[int, bool]:
        """Tokens beyond the local hit that the store holds, loaded synchronously."""
        bs = self._block_size
        req_id = request.request_id
        local_blocks = num_computed_tokens // bs
        cached = self._lookups.get(req_id)
        if cached is not None and cached[0] == local_blocks:
            _, present, external, _heads = cached
        else:
            # At most (tokens - 1): vLLM must compute the last token itself to sample.
            max_blocks = max(request.num_tokens - 1, 0) // bs
            keys = self._keys.keys(request.block_hashes, 0, max_blocks)
            present, heads = self._lookup(req_id, keys)
            external = 0
            for flag in present[local_blocks:]:
                if not flag:
                    break
                external += 1
            self._lookups[req_id] = (local_blocks, present, external, heads)
        if req_id not in self._logged:
            self._logged.add(req_id)
            logger.info(
                "request_id: %s, total_blocks_num: %d, hit hbm: %d, hit external: %d",
                req_id,
                self._keys.num_full_blocks(request.block_hashes),
                local_blocks,
                external,
            )
        return external * bs, False

    def _lookup(self, req_id: str, block_keys: list[bytes]) -> tuple[list[bool], list[int]]:
        """Per block: does the store hold it for every rank (and layer) that reads it? With
        packs, also the block that names each block's pack (as the first rank's packs say)."""
        if not block_keys:
            return [], []
        per = self._keys.keys_per_block
        presence = self._keys.presence_keys(block_keys)
        heads: list[int] = []
        started = time.perf_counter()
        try:
            if self._pack_blocks > 1:  # every rank's (and layer's) key in that rank's pack
                heads = self._store.pack_heads(
                    presence[::per], self._pack_blocks, timeout=self._lookup_timeout_s
                )
                packs = [(presence[h * per + c], i - h) for i, h in enumerate(heads) for c in range(per)]
                # One bound for the lookup, not one per call: the presence check gets what
                # the walk over the packs left of it.
                left = time_left(self._lookup_timeout_s, started)
                flags = self._store.lookup(presence, timeout=left, packs=packs)
            else:
                flags = self._store.lookup(presence, timeout=self._lookup_timeout_s)
        except Exception as exc:  # a store failure is a miss, never a failed request
            logger.warning("UCM lookup error: request_id: %s: %s; the blocks are misses", req_id, exc)
            self._count("lookup_errors", 1)
            if isinstance(exc, TimeoutError):
                self._count("lookup_errors_timeout", 1)
            return [False] * len(block_keys), []
        finally:
            if over_bound(took := time.perf_counter() - started, self._lookup_timeout_s):
                logger.warning("UCM lookup took %.1f s, past its %s s bound", took, self._lookup_timeout_s)
                self._count("lookup_waits_over_bound", 1)
            for name, n in self._errors_since.take().items():
                self._count(name, n)
        return [all(flags[i * per : (i + 1) * per]) for i in range(len(block_keys))], heads

    def _store_stats(self) -> dict[str, int]:
        try:
            return dict(self._store.stats())
        except Exception:  # stats are for reporting: never a reason to fail a lookup
            return {}

    def _count(self, name: str, n: int) -> None:
        if n:
            self.lookup_errors[name] = self.lookup_errors.get(name, 0) + n

    def take_lookup_errors(self) -> dict[str, int]:
        out, self.lookup_errors = self.lookup_errors, {}
        return out

    def update_state_after_alloc(self, request: Any, blocks: Any, num_external_tokens: int) -> None:
        req_id = request.request_id
        lookup = self._lookups.pop(req_id, None)
        local_blocks, present, planned, heads = lookup if lookup is not None else (0, [], 0, [])
        block_ids = list(blocks.get_block_ids()[0]) if blocks is not None else []
        state = _RequestState(request=request, present=present, block_ids=block_ids, pack_heads=heads)
        state.local_blocks = local_blocks
        # vLLM may grant fewer external tokens than offered (never more).
        external = min(num_external_tokens // self._block_size, planned)
        state.external_blocks = external
        if external > 0:
            idx = range(local_blocks, local_blocks + external)
            chain = self._keys.keys(request.block_hashes, 0, local_blocks + external)
            state.pending_load = BlockTransfer(
                req_id=req_id,
                keys=chain[local_blocks:],
                block_ids=[block_ids[i] for i in idx],
                packs=self._packs(chain, idx, state.pack_heads),
            )
            self.external_hit_tokens += external * self._block_size
        self._reqs[req_id] = state

    # ---- per-step metadata ----------------------------------------------------------------
    def build_connector_meta(self, scheduler_output: Any) -> UCMConnectorMetadata:
        meta = UCMConnectorMetadata()
        for new_req in scheduler_output.scheduled_new_reqs:
            state = self._reqs.get(new_req.req_id)
            if state is None:
                continue
            state.block_ids = list(new_req.block_ids[0])
            self._take_load(state, meta)
            self._plan_saves(
                state,
                new_req.num_computed_tokens + scheduler_output.num_scheduled_tokens.get(new_req.req_id, 0),
                meta,
            )
        cached = scheduler_output.scheduled_cached_reqs
        for i, req_id in enumerate(cached.req_ids):
            state = self._reqs.get(req_id)
            if state is None:
                continue
            new_ids = cached.new_block_ids[i]
            if req_id in cached.resumed_req_ids:
                # After preemption vLLM hands the whole block list again.
                state.block_ids = list(new_ids[0]) if new_ids is not None else []
            elif new_ids is not None:
                state.block_ids.extend(new_ids[0])
            self._take_load(state, meta)
            self._plan_saves(
                state,
                cached.num_computed_tokens[i] + scheduler_output.num_scheduled_tokens.get(req_id, 0),
                meta,
            )
        return meta

    def _take_load(self, state: _RequestState, meta: UCMConnectorMetadata) -> None:
        if state.pending_load is not None:
            meta.loads.append(state.pending_load)
            state.pending_load = None

    def _plan_saves(self, state: _RequestState, computed_after_step: int, meta: UCMConnectorMetadata) -> None:
        """Dump the full blocks this step completes that the store does not hold yet."""
        if not self._writes:
            return
        req = state.request
        # Only blocks vLLM has hashed: a block whose tokens are not final (async scheduling,
        # speculative tokens) has no hash yet and is saved in a later step.
        full = min(
            computed_after_step // self._block_size,
            self._keys.num_full_blocks(req.block_hashes),
            len(state.block_ids),
        )
        prompt = getattr(req, "num_prompt_tokens", None)
        if self._pack_blocks > 1 and prompt is not None and computed_after_step < prompt:
            # While the prompt is being prefilled (in chunks), save whole packs only: the blocks
            # of a pack not complete yet wait for a later step, or for the prompt's last one.
            full -= full % self._pack_blocks
        if full <= state.saved_upto:
            return
        todo = [i for i in range(state.saved_upto, full) if not (i < len(state.present) and state.present[i])]
        state.saved_upto = full
        if not todo:
            return
        keys = self._keys.keys(req.block_hashes, 0, full)
        meta.saves.append(
            BlockTransfer(
                req_id=req.request_id,
                keys=[keys[i] for i in todo],
                block_ids=[state.block_ids[i] for i in todo],
                packs=self._packs(keys, todo, state.pack_heads),
            )
        )

    def _packs(
        self, chain: list[bytes], blocks: Sequence[int], heads: list[int]
    ) -> list[tuple[bytes, int]] | None:
        """Per block of `blocks` (positions in the prompt whose block keys from the first on are
        `chain`): the key of the block that names its pack and its index there."""
        return pack_refs(chain, blocks, self._pack_blocks, heads)

    # ---- feedback and lifecycle -----------------------------------------------------------
    def on_load_errors(self, block_ids: set[int]) -> None:
        """Blocks that failed to load will be recomputed: save them again afterwards."""
        if not block_ids:
            return
        for state in self._reqs.values():
            for i, bid in enumerate(state.block_ids):
                if bid in block_ids and i < len(state.present):
                    state.present[i] = False
                    state.saved_upto = min(state.saved_upto, i)

    def request_finished(self, request: Any) -> None:
        req_id = request.request_id
        self._reqs.pop(req_id, None)
        self._lookups.pop(req_id, None)
        self._logged.discard(req_id)

    def reset(self) -> None:
        """Forget cached lookups, so the next requests ask the store afresh."""
        self._lookups.clear()
        for state in self._reqs.values():
            state.present = []
