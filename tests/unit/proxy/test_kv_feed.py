"""One instance's KV-cache event batches applied to the routing index: stored blocks are held by
the instance, removed ones are not, a clear or a missed batch leaves it holding nothing, another
medium than the engine's cache is not its cache, and malformed events are counted and skipped."""

from __future__ import annotations

import msgspec

from ucmctl.proxy.kv_feed import Feed
from ucmctl.proxy.kv_index import KvIndex, block_keys
from ucmctl.proxy.metrics import Metrics
from ucmctl.proxy.pool import Pool
from ucmctl.proxy.rewrite import COMPLETIONS

URL = "http://10.0.0.1:8000"
PROMPT = [(n * 7) % 5000 + 10 for n in range(64)]  # 4 blocks of 16
HASHES = [bytes([n]) * 32 for n in range(4)]
KEYS = block_keys({"model": "m", "prompt": PROMPT}, COMPLETIONS, 16)


def batch(*events: dict) -> bytes:
    return msgspec.msgpack.encode([1.5, list(events), 0])


def stored(hashes: list[bytes], parent: bytes | None, ids: list[int], medium: str | None = "GPU") -> dict:
    return {"type": "BlockStored", "block_hashes": hashes, "parent_block_hash": parent, "token_ids": ids,
            "block_size": 16, "lora_id": None, "medium": medium, "lora_name": None}  # fmt: skip


def setup() -> tuple[Feed, Pool, KvIndex]:
    pool, index = Pool(), KvIndex()
    pool.add(URL, "mixed")
    pool.add("http://10.0.0.2:8000", "mixed")
    return Feed(URL, "tcp://10.0.0.1:5557", "m", pool, index), pool, index


def test_stored_then_removed_blocks_are_what_the_instance_holds() -> None:
    feed, pool, index = setup()
    mine, other = pool.all()
    feed.apply(1, batch(stored(HASHES[:2], None, PROMPT[:32]), stored(HASHES[2:], HASHES[1], PROMPT[32:])))
    assert index.leading(KEYS, [mine, other]) == ([4, 0], 0)  # held, not in the store
    feed.apply(2, batch({"type": "BlockRemoved", "block_hashes": HASHES[2:], "medium": "GPU"}))
    assert index.leading(KEYS, [mine, other]) == ([2, 0], 0)
    assert (feed.stats.batches, feed.stats.events, feed.stats.bad, feed.stats.gaps) == (2, 3, 0, 0)


def test_a_clear_or_a_missed_batch_leaves_the_instance_holding_nothing() -> None:
    feed, pool, index = setup()
    mine = pool.all()[0]
    feed.apply(1, batch(stored(HASHES, None, PROMPT)))
    feed.apply(2, batch({"type": "AllBlocksCleared"}))
    assert index.leading(KEYS, [mine]) == ([0], 0)
    feed.apply(3, batch(stored(HASHES, None, PROMPT)))
    assert index.leading(KEYS, [mine]) == ([4], 0)
    feed.apply(5, batch())  # batch 4 never came: a removal may be in it
    assert index.leading(KEYS, [mine]) == ([0], 0) and feed.stats.gaps == 1
    feed.apply(6, batch(stored(HASHES, None, PROMPT)))
    feed.apply(1, batch())  # numbered from 1 again: the server restarted, its cache is empty
    assert index.leading(KEYS, [mine]) == ([0], 0) and feed.stats.gaps == 1
    # vLLM's hashes name content: after a clear, a block stored after a known one has its key
    feed.apply(2, batch(stored([b"\x09" * 32], HASHES[3], list(range(16)))))
    longer = block_keys({"model": "m", "prompt": [*PROMPT, *range(16)]}, COMPLETIONS, 16)
    assert feed.stats.unknown_parent == 0 and index.leading(longer, [mine]) == ([0], 0)
    assert index.leading(longer[4:], [mine]) == ([1], 0)  # the fifth block alone is held
    feed.apply(3, batch(stored([b"\x0a" * 32], b"\x0b" * 32, list(range(16)))))  # never seen
    assert feed.stats.unknown_parent == 1


def test_another_medium_is_not_the_instances_cache() -> None:
    feed, pool, index = setup()
    feed.apply(1, batch(stored(HASHES, None, PROMPT, medium="CPU")))
    assert index.leading(KEYS, pool.all()) == ([0, 0], 0) and feed.stats.events == 1


def test_malformed_events_and_batches_are_counted_and_skipped() -> None:
    feed, pool, index = setup()
    feed.apply(1, b"\xc1")  # not msgpack
    feed.apply(2, batch({"type": "SomethingNew"}, stored(HASHES, None, PROMPT)))
    assert (feed.stats.bad, feed.stats.events, feed.stats.gaps) == (2, 1, 0)
    assert index.leading(KEYS, pool.all()[:1]) == ([4], 0)


def test_an_instance_removed_from_the_pool_takes_nothing() -> None:
    feed, pool, index = setup()
    pool.remove(URL)
    feed.apply(None, batch(stored(HASHES, None, PROMPT)))
    assert len(index) == 0 and feed.stats.events == 1


def test_the_metrics_count_each_feeds_events_by_outcome() -> None:
    feed, pool, _ = setup()
    feed.apply(1, batch(stored(HASHES, None, PROMPT)))
    feed.apply(3, b"\xc1")
    routing = {"policy": "kv", "index": "events", "blocks": 4, "kv_events": [vars(feed.stats)]}
    text = Metrics().render(pool.all(), None, routing)
    for outcome, value in (("applied", 1), ("bad", 1), ("gap", 1), ("unknown_parent", 0)):
        assert f'ucmctl_proxy_kv_events_total{{instance="{URL}",outcome="{outcome}"}} {value}' in text
    assert text.count("# TYPE ucmctl_proxy_kv_events_total counter") == 1
