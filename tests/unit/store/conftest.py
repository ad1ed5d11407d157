from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

ucm_store = pytest.importorskip("ucm_store", reason="native store not built (pip install -e .)")


@pytest.fixture
def make_store(tmp_path: Path) -> Iterator[Callable[..., ucm_store.Store]]:
    """Opens stores over tmp_path/b0 by default; closes them all at teardown."""
    opened: list[ucm_store.Store] = []

    def make(shard_sizes: list[int], **cfg: object) -> ucm_store.Store:
        cfg.setdefault("storage_backends", str(tmp_path / "b0"))
        cfg.setdefault("cache_buffer_capacity_gb", 0.05)
        store = ucm_store.Store.from_config(cfg, shard_sizes=shard_sizes)
        opened.append(store)
        return store

    yield make
    for s in opened:
        s.close()
