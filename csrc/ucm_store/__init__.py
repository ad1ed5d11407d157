"""The native `Cache|Posix` block store (built from csrc/).

Keys are 16-byte binary digests (``KEY_SIZE``); a block is a list of shards, one per layer,
of the byte sizes given as ``shard_sizes`` when the store is opened. A shard is an
``(address, nbytes)`` tuple of host memory or any C-contiguous buffer-protocol object
(writable for loads). The caller keeps that memory alive and untouched until the task's
result is fetched.

    store = ucm_store.Store.from_config(cfg, shard_sizes=[...])

``cfg`` is the ``ucm_connector_config`` mapping of the UCM YAML:

- ``store_pipeline``: ``"Cache|Posix"`` (default), ``"Posix"`` or ``"Cache"`` (DRAM only,
  nothing persisted).
- ``storage_backends``: absolute paths, a list or joined by ``":"``; block -> ``hash % n``.
- ``cache_buffer_capacity_gb`` (float, default 4), ``posix_capacity_gb`` (float, 0 =
  unlimited; over it the least recently written or read blocks are removed down to 90%).
- ``io_direct`` (bool): O_DIRECT on backends whose filesystem allows it (``store.notes()``
  says why it is off elsewhere); ``io_fsync`` (bool): fdatasync each file and fsync its
  directory around the rename.
- ``cache_copy_threads``, ``posix_io_threads``, ``lookup_threads`` (ints),
  ``cache_prefault``, ``cache_on_load`` (bools), ``stale_temp_s`` (how old another host's
  temp file must be to count as abandoned), ``timeout_ms`` (default for ``wait``; 0 =
  forever). Any other key raises ``ConfigError``.

Operations (all batched; dump and load return a task id at once):

- ``lookup(keys, tier=None, timeout=None) -> list[bool]``; ``tier`` ``"Cache"``/``"Posix"``
  asks one tier.
- ``lookup_prefix(keys, timeout=None) -> int``: leading present blocks, stopping at the first
  miss. With a ``timeout`` (s) a lookup that has not answered by then raises ``TimeoutError``
  (a stalled mount hangs ``stat()``); while it stays stuck, later bounded lookups raise at
  once instead of queueing behind it.
- ``cancel(tid, reason) -> TaskResult``: gives up on a task's unfinished blocks (see there).
- ``finish_within(tid, timeout, op=..., persisted=False) -> Outcome``: the bounded wait the
  connector and the simulator use for each step (see there).
- ``dump(keys, blocks, packs=None) -> int``, ``load(keys, blocks, packs=None) -> int``.
- ``packs`` (dump, load, lookup, lookup_prefix): None, or per key None or ``(head, index)``: the
  key of the block that names the key's pack and its index there (``pack_heads`` finds where
  each block's pack is, ``ucmctl.core.pack_heads.pack_refs`` turns that into references).
  A dump writes the blocks of one head with indices 0, 1, 2... as one pack once they are all
  in the DRAM tier (blocks past a gap, or that another writer's pack of the same head does not
  hold, go to files of their own; a persisted outcome per block as ever); a load
  reads the blocks of one pack that miss the cache in one read, and looks for a block the pack
  does not hold in its own file; a lookup asks the pack's header (once per call), then the file.
- ``pack_heads(chain, per_pack, timeout=None) -> list[int]``: per block of a prefix chain, the
  position of the block that names its pack, following the packs on disk (a chain that forks
  inside another's pack keeps its own blocks of that pack's range in a *tail pack* named by the
  first of them); bounded as ``lookup``.
- ``wait(tid, timeout=None) -> TaskResult`` (``TimeoutError`` on timeout) and
  ``check(tid) -> TaskResult | None``. A result is handed out once: fetching it forgets the
  task (a second wait raises ``KeyError``). ``TaskResult.ok`` / ``.errors`` are per block,
  ``.all_ok`` is their conjunction.
- With ``Cache|Posix`` a dump's ``wait`` returns once the bytes are in DRAM; the write to
  Posix happens in the background. ``wait_persisted(tid, timeout=None) -> TaskResult`` and
  ``check_persisted(tid)`` tell per block when (and whether) it reached the last tier;
  ``flush(timeout=None) -> bool`` waits for every dump accepted so far. A block is reported
  persisted only once its own write reached the last tier, also when the same key was being
  dumped by another task at the time.
- A dump's persisted outcome stays fetchable after ``wait`` (until fetched, or until 65,536
  newer ones finished); fetching it with ``wait_persisted`` forgets the task altogether, so a
  later ``wait`` raises ``KeyError`` (persisted implies stored). ``stats()["tasks_live"]``
  counts the tasks whose results the store still holds.
- An unexpected error inside a store worker fails that block (``"internal error: ..."``,
  counted in ``stats()["job_errors"]``); it never ends the process.
- A load verifies the block's header and CRC-32C before any byte reaches the caller's
  buffer; a corrupt, torn or truncated file is a failed block whose error says why, and the
  file is moved to ``<backend>/corrupt/``.
- Packs (several blocks of one chain in one file; ``csrc/README.md``), synchronous, for tests
  and benchmarks: ``write_pack(keys, blocks) -> (error, held)``, ``pack_prefix(keys) -> int``,
  ``read_pack(keys, begin, end, blocks) -> list[str]``.
- ``stats() -> dict[str, int]``, ``notes() -> list[str]``, ``direct_io() -> list[bool]``,
  ``collect_garbage() -> dict`` (one synchronous pass: stale temp files, capacity),
  ``close()``; the store is a context manager.
"""

from __future__ import annotations

import contextlib
import queue
import threading
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ucm_store import _native
from ucm_store._native import FORMAT_VERSION, TaskResult
from ucm_store.config import PIPELINES, TIERS, ConfigError, StoreSettings, parse

KEY_SIZE: int = _native.KEY_SIZE

__all__ = [
    "FORMAT_VERSION",
    "KEY_SIZE",
    "PIPELINES",
    "TIERS",
    "ConfigError",
    "Outcome",
    "Store",
    "StoreSettings",
    "TaskResult",
]

_TIER_CODES = {None: 0, "Cache": 1, "Posix": 2}

# Per key: None, or (the key of its pack's first block, its index in that pack).
PackRefs = Sequence[tuple[bytes, int] | None]


def _ms(timeout: float | None, default_ms: int) -> int:
    if timeout is None:
        return default_ms if default_ms > 0 else -1
    if timeout < 0:
        raise ValueError(f"timeout must be >= 0 seconds or None, got {timeout!r}")
    return int(timeout * 1000)


@dataclass
class Outcome:
    """Per-block outcome of a task waited for with `Store.finish_within`."""

    ok: list[bool]
    errors: list[str]

    @property
    def all_ok(self) -> bool:
        return all(self.ok)


class _BoundedCalls:
    """Runs calls that may hang in the filesystem on one daemon thread, waiting at most a
    timeout for each. A call that times out keeps that thread (nothing can cancel a thread
    stuck in a FUSE request); until it returns, every bounded call fails at once."""

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue[tuple[Any, tuple[Any, ...], dict[str, Any]]] = queue.SimpleQueue()
        self._stuck_since: float | None = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def _run(self) -> None:
        while True:
            fn, args, box = self._jobs.get()
            try:
                box["value"] = fn(*args)
            except BaseException as exc:  # handed to the caller
                box["error"] = exc
            with self._lock:  # with call()'s check of done: a stuck mark never outlives its call
                self._stuck_since = None
                box["done"].set()
            del fn, args, box  # hold nothing of the store between calls (it may be closed)

    @property
    def stuck_since(self) -> float | None:
        return self._stuck_since

    def call(self, fn: Any, args: tuple[Any, ...], timeout: float) -> Any:
        with self._lock:
            if self._stuck_since is not None:
                stuck = time.monotonic() - self._stuck_since
                raise TimeoutError(f"an earlier lookup has been stuck in the storage for {stuck:.1f} s")
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="ucm-bounded", daemon=True)
                self._thread.start()
        box: dict[str, Any] = {"done": threading.Event()}
        self._jobs.put((fn, args, box))
        if not box["done"].wait(timeout):
            with self._lock:
                if not box["done"].is_set():
                    self._stuck_since = time.monotonic() - timeout
            if not box["done"].is_set():
                raise TimeoutError(f"lookup not answered within {timeout:g} s")
        if "error" in box:
            raise box["error"]
        return box["value"]


class Store:
    """A block store over a tier pipeline; see the module docstring."""

    def __init__(self, settings: StoreSettings, shard_sizes: Sequence[int], io_prefault: bool = True) -> None:
        """`io_prefault`: fault in each I/O thread's read buffer (a block's bytes) now, so the
        first loads do not pay for it; False for a store that only looks up."""
        self.settings = settings
        self._bounded = _BoundedCalls()
        self._stalled: tuple[int, float] | None = None  # a dump not persisted in time, since when
        self._native = _native.Store(
            cache=settings.cache,
            posix=settings.posix,
            cache_bytes=settings.cache_bytes,
            backends=settings.backends,
            posix_capacity=settings.posix_capacity,
            io_direct=settings.io_direct,
            io_fsync=settings.io_fsync,
            shard_sizes=list(shard_sizes),
            copy_threads=settings.copy_threads,
            io_threads=settings.io_threads,
            lookup_threads=settings.lookup_threads,
            cache_prefault=settings.cache_prefault,
            cache_on_load=settings.cache_on_load,
            stale_temp_s=settings.stale_temp_s,
            io_prefault=io_prefault,
        )
        for note in self._native.notes():
            warnings.warn(f"ucm_store: {note}", RuntimeWarning, stacklevel=3)

    @classmethod
    def from_config(
        cls, cfg: Mapping[str, Any], shard_sizes: Sequence[int], io_prefault: bool = True
    ) -> Store:
        """Opens a store from the UCM `ucm_connector_config` mapping (`io_prefault`: see Store)."""
        return cls(parse(cfg, shard_sizes), shard_sizes, io_prefault)

    @property
    def shard_sizes(self) -> list[int]:
        return list(self._native.shard_sizes)

    @property
    def block_bytes(self) -> int:
        return sum(self._native.shard_sizes)

    def lookup(
        self,
        keys: Sequence[bytes],
        tier: str | None = None,
        timeout: float | None = None,
        packs: PackRefs | None = None,
    ) -> list[bool]:
        """Presence of each key (in any tier, or in `tier` alone); see `timeout` and `packs` above."""
        if tier not in _TIER_CODES:
            raise ValueError(f"tier must be None, 'Cache' or 'Posix', got {tier!r}")
        if timeout is None:
            return self._native.lookup(keys, _TIER_CODES[tier], packs)
        self._refuse_if_stalled()
        return self._bounded.call(self._native.lookup, (list(keys), _TIER_CODES[tier], packs), timeout)

    def lookup_prefix(
        self, keys: Sequence[bytes], timeout: float | None = None, packs: PackRefs | None = None
    ) -> int:
        """Number of leading keys present, stopping at the first miss."""
        if timeout is None:
            return self._native.lookup_prefix(keys, packs)
        self._refuse_if_stalled()
        return self._bounded.call(self._native.lookup_prefix, (list(keys), packs), timeout)

    def pack_heads(self, chain: Sequence[bytes], per_pack: int, timeout: float | None = None) -> list[int]:
        """Per block of a prefix chain (its block keys from the first on), the position of the
        block that names the pack it is in, or is to be stored in.

        Block ``p``'s pack holds blocks of the range ``p - p % per_pack`` .. ``+ per_pack - 1``
        only. The pack of the range's first block holds our leading blocks as far as its keys
        match ours; where another chain wrote it and ours forks inside, the blocks past the fork
        are in a pack named by the first of them (a tail pack, which a third chain forking later
        continues the same way), and the blocks past the last pack found are to be stored in a
        pack named by the first of them. Without packs on disk: ``p - p % per_pack``. One
        header read per pack found, bounded by ``timeout`` as ``lookup``."""
        keys = list(chain)

        def walk() -> list[int]:
            heads: list[int] = []
            for first in range(0, len(keys), per_pack):
                end, at = min(first + per_pack, len(keys)), first
                while at < end and (held := int(self._native.pack_prefix(keys[at:end]))) > 0:
                    heads += [at] * held
                    at += held
                heads += [at] * (end - at)
            return heads

        if per_pack < 1:
            raise ValueError(f"per_pack must be >= 1, got {per_pack!r}")
        if timeout is None:
            return walk()
        self._refuse_if_stalled()
        return list(self._bounded.call(walk, (), timeout))

    def stalled_for(self) -> float | None:
        """Seconds since a bounded wait found the storage stalled, while it still is; else None.

        Stalled: a bounded lookup still stuck in the filesystem, or a dump not persisted in time
        whose writes have not returned yet. Either one makes the other kind of bounded wait
        return at once, so a request looking up and saving in one step pays one bound, not two.
        """
        since = [t for t in (self._bounded.stuck_since, self._dump_stalled_since()) if t is not None]
        return time.monotonic() - min(since) if since else None

    def _dump_stalled_since(self) -> float | None:
        if self._stalled is None:
            return None
        if self.check_persisted(self._stalled[0]) is not None:
            self._stalled = None  # that write returned: the storage answers again
            return None
        return self._stalled[1]

    def _refuse_if_stalled(self) -> None:
        if (since := self._dump_stalled_since()) is not None:
            raise TimeoutError(f"the storage is stalled ({time.monotonic() - since:.0f} s): lookup not tried")

    def dump(
        self, keys: Sequence[bytes], blocks: Sequence[Sequence[Any]], packs: PackRefs | None = None
    ) -> int:
        """Starts writing `blocks[i]` under `keys[i]` (in packs: see `packs` above); returns a task id."""
        return self._native.dump(keys, blocks, packs)

    def load(
        self, keys: Sequence[bytes], blocks: Sequence[Sequence[Any]], packs: PackRefs | None = None
    ) -> int:
        """Starts reading `keys[i]` into the buffers `blocks[i]`; returns a task id."""
        return self._native.load(keys, blocks, packs)

    def wait(self, tid: int, timeout: float | None = None) -> TaskResult:
        """Result of a task; raises TimeoutError if it is still running after `timeout` s."""
        res = self._call(self._native.wait, tid, _ms(timeout, self.settings.timeout_ms))
        if res is None:
            raise TimeoutError(f"task {tid} still running after {timeout} s")
        return res

    def cancel(self, tid: int, reason: str = "timed out") -> TaskResult:
        """Gives up on the blocks of task `tid` still running; returns its outcome, as `wait`.

        Blocks given up fail with `reason`. Once it returns, no worker touches the task's
        buffers again: a read still stuck in the filesystem that returns later fills the
        DRAM cache at most, never the caller's memory (which may belong to someone else by
        then). Waits only for memory copies in progress, never for I/O; with the `Posix`
        pipeline alone a dump writes straight from the caller's memory, so a cancel of a
        dump waits for the writes already running.
        """
        return self._call(self._native.cancel, tid, reason)

    def finish_within(
        self,
        tid: int,
        timeout: float,
        *,
        op: str = "load",
        persisted: bool = False,
        stall_s: float | None = None,
    ) -> Outcome:
        """The outcome of task `tid` within `timeout` s, whatever the storage does meanwhile.

        Blocks not done by then are given up (`cancel`: the store lets go of their memory).
        With `persisted` (a dump whose blocks must reach the shared tier before the step
        ends), the rest of the time is spent waiting for that; when that wait times out,
        the storage counts as stalled, and later calls do not wait for persistence at all
        (their blocks are reported not persisted at once) until that write has returned:
        one stalled mount costs one bounded wait, not one per step (see `stalled_for`).
        With `stall_s`, a load (and that wait for persistence) also ends as a stall once no
        read (write) of the storage has returned for `stall_s` s: storage that is slow but
        moving gets the whole `timeout`, storage that stopped costs `stall_s`.
        """
        start = time.monotonic()
        deadline = start + timeout
        try:
            if op == "load" and stall_s is not None:
                fetch = lambda t: self.wait(tid, timeout=t)  # noqa: E731
                res = self._within_while_moving(fetch, deadline, stall_s, self._reads_returned, "read")
            else:
                try:
                    res = self.wait(tid, timeout=timeout)
                except TimeoutError:
                    raise TimeoutError("the storage is stalled or slow") from None
        except TimeoutError as exc:
            took = time.monotonic() - start
            res = self.cancel(tid, f"{op} timed out after {took:.1f} s of its {timeout:.3g} s bound ({exc})")
        ok, errors = list(res.ok), list(res.errors)
        if not persisted or not any(ok):
            return Outcome(ok, errors)
        if (age := self.stalled_for()) is not None:
            why = f"dump not persisted within {timeout:g} s: the storage is stalled ({age:.0f} s)"
            return Outcome([False] * len(ok), [e or why for e in errors])
        try:
            done = self._persisted_within(tid, deadline, stall_s)
        except TimeoutError as exc:
            self._stalled = (tid, time.monotonic())
            why = f"dump not persisted within {timeout:g} s ({exc})"
            return Outcome([False] * len(ok), [e or why for e in errors])
        return Outcome(
            [a and b for a, b in zip(ok, done.ok, strict=True)],
            [e or p for e, p in zip(errors, done.errors, strict=True)],
        )

    def _persisted_within(self, tid: int, deadline: float, stall_s: float | None) -> TaskResult:
        """`wait_persisted` until `deadline`, or with `stall_s` until no write has returned for
        that long (TimeoutError saying which)."""
        if stall_s is None:
            try:
                return self.wait_persisted(tid, timeout=max(deadline - time.monotonic(), 0.0))
            except TimeoutError:
                raise TimeoutError("the storage is stalled or slow") from None
        fetch = lambda t: self.wait_persisted(tid, timeout=t)  # noqa: E731
        return self._within_while_moving(fetch, deadline, stall_s, self._writes_returned, "write")

    @staticmethod
    def _within_while_moving(
        fetch: Callable[[float], TaskResult],
        deadline: float,
        stall_s: float,
        returned: Callable[[], int],
        what: str,
    ) -> TaskResult:
        """`fetch(timeout)` until `deadline`, and only while the storage moves: TimeoutError once
        no `what` (read, write) has returned for `stall_s` s, or at the deadline."""
        seen, since = returned(), time.monotonic()
        while True:
            now = time.monotonic()
            with contextlib.suppress(TimeoutError):
                return fetch(max(min(deadline - now, 0.05), 0.0))
            now = time.monotonic()
            if now >= deadline:
                raise TimeoutError("the storage is slow")
            if (count := returned()) != seen:
                seen, since = count, now
            elif now - since >= stall_s:
                raise TimeoutError(f"the storage is stalled: no {what} returned for {stall_s:g} s")

    def _reads_returned(self) -> int:
        """Blocks of loads that came back so far: copied out of the cache, or read from the
        last tier (well or not)."""
        st = self.stats()
        return st["cache_blocks_read"] + st["posix_hits"] + st["posix_misses"] + st["posix_read_errors"]

    def _writes_returned(self) -> int:
        """Writes to the last tier that returned so far, well or not."""
        st = self.stats()
        return st["posix_blocks_written"] + st["posix_write_skipped"] + st["posix_write_errors"]

    def check(self, tid: int) -> TaskResult | None:
        """Result of a finished task, or None while it runs (never blocks)."""
        return self._call(self._native.wait, tid, 0)

    def wait_persisted(self, tid: int, timeout: float | None = None) -> TaskResult:
        """Per-block outcome of dump `tid` reaching the last tier."""
        res = self._call(self._native.wait_persisted, tid, _ms(timeout, self.settings.timeout_ms))
        if res is None:
            raise TimeoutError(f"dump task {tid} not persisted after {timeout} s")
        return res

    def check_persisted(self, tid: int) -> TaskResult | None:
        """Like wait_persisted, but None while blocks are still being written through."""
        return self._call(self._native.wait_persisted, tid, 0)

    def flush(self, timeout: float | None = None) -> bool:
        """Waits until every dump accepted so far reached the last tier; False on timeout."""
        return self._native.flush(_ms(timeout, 0))

    # ---- packs: several blocks of one chain in one file (csrc/README.md, "Packs") ----------
    # Synchronous calls on the caller's thread, for the block layer under the pipeline; the
    # dump/load tasks do not use packs yet.
    def write_pack(self, keys: Sequence[bytes], blocks: Sequence[Sequence[Any]]) -> tuple[str, int]:
        """Stores ``blocks[i]`` under ``keys[i]`` as one pack named by ``keys[0]`` (``keys`` are
        consecutive blocks of one chain). Returns ``(error, held)``: ``held`` is how many
        leading blocks the pack on disk holds, all of them once written; fewer when a pack of
        the same first block was there already (another chain after it), which is never
        replaced."""
        err, held = self._native.pack_write(list(keys), list(blocks))
        return str(err), int(held)

    def pack_prefix(self, keys: Sequence[bytes]) -> int:
        """How many leading ``keys`` the pack of ``keys[0]`` holds (0 without one)."""
        return int(self._native.pack_prefix(list(keys)))

    def read_pack(
        self, keys: Sequence[bytes], begin: int, end: int, blocks: Sequence[Sequence[Any]]
    ) -> list[str]:
        """Loads blocks ``begin..end-1`` of the pack of ``keys[0]`` into ``blocks`` (one per
        block of the range, writable); the reason per block, ``""`` when loaded. Every block is
        checked against its key and CRC-32C first; a block that fails moves the pack aside."""
        return list(self._native.pack_read(list(keys), begin, end, list(blocks)))

    def collect_garbage(self) -> dict[str, int]:
        """Runs one collector pass now (stale temp files, capacity limit)."""
        return self._native.collect_garbage()

    def stats(self) -> dict[str, int]:
        """Counters: bytes/blocks per tier, hits, misses, evictions, errors, corrupt blocks."""
        return self._native.stats()

    def notes(self) -> list[str]:
        """Conditions worth knowing (direct I/O refused by a filesystem, unusable backend)."""
        return self._native.notes()

    def direct_io(self) -> list[bool]:
        """Whether each backend currently uses O_DIRECT."""
        return self._native.direct_io()

    @property
    def closed(self) -> bool:
        return self._native.closed

    def close(self) -> None:
        """Persists pending write-throughs, stops the workers and frees the cache."""
        self._native.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @staticmethod
    def _call(fn: Any, tid: int, timeout_ms: int) -> Any:
        try:
            return fn(tid, timeout_ms)
        except IndexError as e:  # nanobind maps std::out_of_range to IndexError
            raise KeyError(str(e)) from None
