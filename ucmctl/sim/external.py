"""The external KV tier of a simulated instance: the project's native store, real bytes."""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence

from ucmctl.core.pack_heads import pack_refs
from ucmctl.core.store_errors import (
    LOAD_KINDS,
    LOOKUP_KINDS,
    SAVE_KINDS,
    WAIT_OPS,
    LookupErrorsSince,
    error_kind,
    over_bound,
    time_left,
)
from ucmctl.core.ucm_config import load_bound, load_ucm_config, lookup_bound, stall_bound

log = logging.getLogger("ucmctl.sim")


class ExternalTier:
    """Reads and writes whole blocks through `ucm_store`, as the connector does in vLLM.

    A block's bytes are derived from its key, so a load proves the right block came back.
    Lookups, loads and dumps are bounded as the connector's (`load_timeout_s`,
    `dump_timeout_s` of the UCM config): past the bound a lookup is a miss and a task is
    given up (`Store.cancel`), so a stalled mount costs recomputes, never a frozen server.
    Failures are counted by kind under the connector's metric names.
    """

    def __init__(self, ucm_config_file: str, block_bytes: int, shards: int = 4) -> None:
        import ucm_store  # the native store is only needed when the connector is configured

        cfg, checked = load_ucm_config(ucm_config_file)
        self.wait_persisted = checked.wait_persisted
        self.pack_blocks = checked.pack_blocks
        self.load_timeout_s = checked.load_timeout_s
        self.dump_timeout_s = checked.dump_timeout_s
        shard = max(1, block_bytes // shards)
        self.shard_sizes = [shard] * shards
        self.store = ucm_store.Store.from_config(cfg, shard_sizes=self.shard_sizes)
        self.loaded_blocks = 0
        self.block_bytes = block_bytes
        # What moved, as the connector counts it (vllm:ucm_{load,save}_{blocks,bytes,seconds}_total)
        self.moved: dict[str, float] = {
            f"{op}_{what}": 0.0 for op in ("load", "save") for what in ("blocks", "bytes", "seconds")
        }
        self.load_failures = 0
        self.saved_blocks = 0
        # The connector's counters (ucm_connector.stats): load_errors, load_errors_<kind>, ...
        self.counts: dict[str, int] = dict.fromkeys(
            ["load_errors", "save_errors", "lookup_errors"]
            + [f"lookup_errors_{k}" for k in LOOKUP_KINDS]
            + [f"load_errors_{k}" for k in LOAD_KINDS]
            + [f"save_errors_{k}" for k in SAVE_KINDS]
            + [f"{op}_waits_over_bound" for op in WAIT_OPS],
            0,
        )
        self._lookup_errors = LookupErrorsSince(self.store.stats)
        # The longest one lookup, load or save took (at most the bound and a memory copy).
        self.longest_wait_s = dict.fromkeys(("lookup", "load", "save"), 0.0)

    def _took(self, started: float, op: str, nbytes: int = 0) -> None:
        took = time.perf_counter() - started
        self.longest_wait_s[op] = max(self.longest_wait_s[op], took)
        bounds = {
            "lookup": lookup_bound(self.load_timeout_s),
            "load": load_bound(self.load_timeout_s, nbytes),
        }
        bound = bounds.get(op, self.dump_timeout_s)
        if over_bound(took, bound):
            log.warning("sim: a store %s took %.1f s, past its %.1f s bound", op, took, bound)
            self.counts[f"{op}_waits_over_bound"] += 1

    def packs(
        self, chain: Sequence[bytes], start: int, count: int, heads: Sequence[int] = ()
    ) -> list[tuple[bytes, int]] | None:
        """Pack references of blocks start..start+count-1 of a prompt whose keys from the first
        block on are `chain`, its packs' heads as `pack_heads` found them (as the connector's
        scheduler side makes them); None without packs."""
        return pack_refs(chain, range(start, start + count), self.pack_blocks, heads)

    def pack_heads(self, chain: Sequence[bytes]) -> list[int] | None:
        """Per block of a prompt's chain, the block that names its pack, as the packs on disk
        say (ucm_store.Store.pack_heads, bounded as a lookup); [] without packs; None when the
        storage does not answer: the lookup is a miss, counted once, as the connector's (the
        blocks are then saved by their ranges)."""
        if self.pack_blocks <= 1 or not chain:
            return []
        started = time.perf_counter()
        try:
            return self.store.pack_heads(
                list(chain), self.pack_blocks, timeout=lookup_bound(self.load_timeout_s)
            )
        except TimeoutError as exc:
            self.counts["lookup_errors"] += 1
            self.counts["lookup_errors_timeout"] += 1
            log.warning("UCM lookup error: %s; the blocks are misses", exc)
            return None
        finally:
            self._took(started, "lookup")

    def lookup_prefix(
        self,
        keys: Sequence[bytes],
        packs: Sequence[tuple[bytes, int]] | None = None,
        started: float | None = None,
    ) -> int:
        """Leading `keys` present; `started`: when this request's lookup began (its
        `pack_heads` walk), so that both calls together keep to one lookup bound."""
        if not keys:
            return 0
        since = time.perf_counter() if started is None else started
        try:
            bound = time_left(lookup_bound(self.load_timeout_s), since)
            return self.store.lookup_prefix(list(keys), timeout=bound, packs=packs)
        except TimeoutError as exc:
            self.counts["lookup_errors"] += 1
            self.counts["lookup_errors_timeout"] += 1
            log.warning("UCM lookup error: %s; the blocks are misses", exc)
            return 0
        finally:
            self._took(since, "lookup")
            for name, n in self._lookup_errors.take().items():
                self.counts[name] += n

    def _count(self, op: str, errors: Sequence[str]) -> None:
        kinds = LOAD_KINDS if op == "load" else SAVE_KINDS
        self.counts[f"{op}_errors"] += len(errors)
        for kind in filter(None, map(error_kind, errors)):
            if kind in kinds:
                self.counts[f"{op}_errors_{kind}"] += 1

    def load(self, keys: Sequence[bytes], packs: Sequence[tuple[bytes, int]] | None = None) -> int:
        """Load blocks into fresh buffers and verify them; returns how many leading blocks are good."""
        if not keys:
            return 0
        buffers = [[bytearray(size) for size in self.shard_sizes] for _ in keys]
        started = time.perf_counter()
        nbytes = len(keys) * self.block_bytes
        result = self.store.finish_within(  # as the connector
            self.store.load(list(keys), buffers, packs=packs),
            load_bound(self.load_timeout_s, nbytes),
            op="load",
            stall_s=stall_bound(self.load_timeout_s),
        )
        self._took(started, "load", nbytes)
        failed = [e or "failed" for ok, e in zip(result.ok, result.errors, strict=True) if not ok]
        self._count("load", failed)
        if failed:
            log.warning(
                "UCM load error: %d block(s) not loaded (first: %s); recomputed", len(failed), failed[0]
            )
        good = 0
        for key, ok, block in zip(keys, result.ok, buffers, strict=True):
            if not ok or bytes(block[0][:16]) != _pattern(key, 16):
                self.load_failures += 1
                if ok:  # delivered, but not this key's bytes: never expected, always counted
                    self._count("load", ["wrong bytes (corrupt)"])
                break
            good += 1
        self.loaded_blocks += good
        self.moved["load_blocks"] += good
        self.moved["load_bytes"] += good * self.block_bytes
        self.moved["load_seconds"] += time.perf_counter() - started
        return good

    def save(self, keys: Sequence[bytes], packs: Sequence[tuple[bytes, int] | None] | None = None) -> None:
        if not keys:
            return
        blocks = [[_pattern(key, size) for size in self.shard_sizes] for key in keys]
        # As the connector: with wait_persisted the step ends once the blocks are on disk.
        started = time.perf_counter()
        result = self.store.finish_within(
            self.store.dump(list(keys), blocks, packs=packs if packs and any(packs) else None),
            self.dump_timeout_s,
            op="dump",
            persisted=self.wait_persisted,
            stall_s=stall_bound(self.load_timeout_s),  # as the connector
        )
        self._took(started, "save")
        ok, errors = result.ok, result.errors
        self.saved_blocks += sum(ok)
        self.moved["save_blocks"] += sum(ok)
        self.moved["save_bytes"] += sum(ok) * self.block_bytes
        self.moved["save_seconds"] += time.perf_counter() - started
        failed = [e or "failed" for flag, e in zip(ok, errors, strict=True) if not flag]
        if failed:
            self._count("save", failed)
            log.warning("UCM save error: %d block(s) not stored (first: %s)", len(failed), failed[0])

    def close(self) -> None:
        self.store.close()


def _pattern(key: bytes, size: int) -> bytes:
    return (key * (size // len(key) + 1))[:size]
