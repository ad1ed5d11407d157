"""The simulator's external tier (ucmctl/sim/external.py) over the real `ucm_store`: its lookups
keep to the connector's bounds."""

from __future__ import annotations

import time
from pathlib import Path

import yaml
from ucm_store import _native

from tests.support.processes import wait_for
from ucmctl.sim.external import ExternalTier

BLOCK = 64 << 10


def tier(tmp_path: Path, load_timeout_s: float) -> ExternalTier:
    cfg = {
        "ucm_connectors": [
            {
                "ucm_connector_name": "UcmPipelineStore",
                "ucm_connector_config": {"store_pipeline": "Posix", "storage_backends": str(tmp_path / "kv")},
            }
        ],
        "load_timeout_s": load_timeout_s,
        "pack_blocks": 4,
    }
    (tmp_path / "kv").mkdir(exist_ok=True)
    path = tmp_path / f"ucm-{load_timeout_s}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return ExternalTier(str(path), BLOCK)


def test_finding_the_packs_and_checking_the_blocks_share_one_lookup_bound(tmp_path: Path) -> None:
    """As the connector's scheduler side: with packs a lookup is the walk over the packs'
    headers, then the presence check; together they keep to one lookup bound (half the load
    bound), so a slow mount that lets each fit alone still costs one bound and a miss."""
    keys = [f"block-{i}".encode().ljust(16, b".") for i in range(8)]
    first = tier(tmp_path, 10.0)
    first.save(keys, first.packs(keys, 0, 8, first.pack_heads(keys)))
    assert first.saved_blocks == 8
    assert first.lookup_prefix(keys, first.packs(keys, 0, 8, first.pack_heads(keys))) == 8

    slow = tier(tmp_path, 1.4)  # lookups bounded at 0.7 s
    # Every header read takes 0.3 s: the walk reads 2 (0.6 s, inside the bound), and the
    # presence check would read them again.
    _native._inject_stall("posix_stat", 8, 300)
    try:
        t0 = time.perf_counter()
        heads = slow.pack_heads(keys)
        assert heads == [0] * 4 + [4] * 4
        found = slow.lookup_prefix(keys, slow.packs(keys, 0, 8, heads), t0)
        waited = time.perf_counter() - t0
        assert found == 0
        assert 0.65 <= waited < 0.85, f"the lookup waited {waited:.2f} s, its bound 0.7 s"
        assert slow.counts["lookup_errors_timeout"] == 1
        assert slow.counts["lookup_waits_over_bound"] == 0
    finally:
        _native._inject_stall("posix_stat", 0, 0)
    assert wait_for(lambda: slow.store.stalled_for() is None, timeout=5)  # the stuck reads returned
    assert slow.lookup_prefix(keys, slow.packs(keys, 0, 8, slow.pack_heads(keys))) == 8


def test_a_walk_the_storage_does_not_answer_is_one_miss_counted_once(tmp_path: Path) -> None:
    """A header read stuck past the lookup bound: pack_heads says None (not "no packs"), so
    the engine asks nothing more for that request; one lookup error, as the connector counts."""
    keys = [f"chain-{i}".encode().ljust(16, b".") for i in range(8)]
    first = tier(tmp_path, 10.0)
    first.save(keys, first.packs(keys, 0, 8, first.pack_heads(keys)))
    slow = tier(tmp_path, 0.6)  # lookups bounded at 0.3 s
    _native._inject_stall("posix_stat", 1, 1200)
    try:
        t0 = time.perf_counter()
        assert slow.pack_heads(keys) is None
        assert time.perf_counter() - t0 < 0.8
        assert slow.counts["lookup_errors"] == 1 and slow.counts["lookup_errors_timeout"] == 1
    finally:
        _native._inject_stall("posix_stat", 0, 0)
    assert wait_for(lambda: slow.store.stalled_for() is None, timeout=5)  # the stuck read returned
    assert slow.pack_heads(keys) == [0] * 4 + [4] * 4
