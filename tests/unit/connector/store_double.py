"""FakeStore: an in-memory TEST DOUBLE of the `ucm_store.Store` interface (tests only).

It copies real bytes through shard addresses, so worker tests check values, and it can be
told to fail keys, whole calls, or lookups, to drive the connector's error paths.
"""

from __future__ import annotations

import ctypes
import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any


@dataclass
class FakeTaskResult:
    ok: list[bool]
    errors: list[str]

    @property
    def all_ok(self) -> bool:
        return all(self.ok)


def _addr(shard: Any) -> tuple[int, int]:
    if isinstance(shard, tuple):
        return shard
    mv = memoryview(shard)
    buf = (ctypes.c_char * mv.nbytes).from_buffer(mv)
    return ctypes.addressof(buf), mv.nbytes


@dataclass
class FakeStore:
    shard_sizes: list[int]
    blocks: dict[bytes, bytes] = field(default_factory=dict)
    corrupt: set[bytes] = field(default_factory=set)
    fail_calls: bool = False
    fail_lookup: bool = False
    calls: list[tuple[str, list[bytes]]] = field(default_factory=list)
    _results: dict[int, FakeTaskResult] = field(default_factory=dict)
    _ids: Any = field(default_factory=lambda: itertools.count(1))

    def lookup(
        self, keys: Sequence[bytes], tier: str | None = None, timeout: float | None = None
    ) -> list[bool]:
        if self.fail_lookup:
            raise OSError("lookup failed (injected)")
        self.calls.append(("lookup", list(keys)))
        return [k in self.blocks for k in keys]

    def lookup_prefix(self, keys: Sequence[bytes], timeout: float | None = None) -> int:
        n = 0
        for present in self.lookup(keys):
            if not present:
                break
            n += 1
        return n

    def _check_block(self, shards: Sequence[Any]) -> list[tuple[int, int]]:
        addrs = [_addr(s) for s in shards]
        assert [n for _, n in addrs] == self.shard_sizes, (addrs, self.shard_sizes)
        return addrs

    def dump(self, keys: Sequence[bytes], blocks: Sequence[Sequence[Any]]) -> int:
        if self.fail_calls:
            raise OSError("dump refused (injected)")
        self.calls.append(("dump", list(keys)))
        for k, shards in zip(keys, blocks, strict=True):
            self.blocks[bytes(k)] = b"".join(ctypes.string_at(a, n) for a, n in self._check_block(shards))
        tid = next(self._ids)
        self._results[tid] = FakeTaskResult([True] * len(keys), [""] * len(keys))
        return tid

    def load(self, keys: Sequence[bytes], blocks: Sequence[Sequence[Any]]) -> int:
        if self.fail_calls:
            raise OSError("load refused (injected)")
        self.calls.append(("load", list(keys)))
        ok, errors = [], []
        for k, shards in zip(keys, blocks, strict=True):
            data = self.blocks.get(bytes(k))
            if data is None or k in self.corrupt:
                ok.append(False)
                errors.append("checksum mismatch (injected)" if data is not None else "not found")
                continue
            off = 0
            for a, n in self._check_block(shards):
                ctypes.memmove(a, data[off : off + n], n)
                off += n
            ok.append(True)
            errors.append("")
        tid = next(self._ids)
        self._results[tid] = FakeTaskResult(ok, errors)
        return tid

    def wait(self, tid: int, timeout: float | None = None) -> FakeTaskResult:
        return self._results.pop(tid)

    def wait_persisted(self, tid: int, timeout: float | None = None) -> FakeTaskResult:
        return self._results.pop(tid)  # one tier: written is persisted

    def finish_within(self, tid: int, timeout: float, **how: object) -> FakeTaskResult:
        return self._results.pop(tid)  # every task finished at submit; one tier: persisted

    def cancel(self, tid: int, reason: str = "timed out") -> FakeTaskResult:
        return self._results.pop(tid)  # every task finished at submit

    def check(self, tid: int) -> FakeTaskResult | None:
        return self._results.pop(tid, None)

    def flush(self, timeout: float | None = None) -> bool:
        return True

    def stats(self) -> dict[str, int]:
        return {"blocks": len(self.blocks)}

    def close(self) -> None:
        pass
