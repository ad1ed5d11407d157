"""The simulator's prefix cache records vLLM's KV-cache events: new blocks in a row as one
BlockStored naming its parent and tokens, evictions as BlockRemoved, a reset as AllBlocksCleared;
and the proxy reads them into the keys it makes of the same prompt. `--kv-events-config` is read
as vLLM reads it."""

from __future__ import annotations

import msgspec
import pytest

from ucmctl.core.errors import UcmctlError
from ucmctl.proxy.kv_events import Stored, Translation, decode
from ucmctl.proxy.kv_index import block_keys
from ucmctl.proxy.rewrite import COMPLETIONS
from ucmctl.sim.kv_events import EventsConfig, parse_events_config
from ucmctl.sim.prefix_cache import PrefixCache
from ucmctl.sim.prefix_cache import block_keys as sim_keys

PROMPT = [(n * 13) % 900 + 5 for n in range(80)]  # 5 blocks of 16


def test_new_blocks_in_a_row_are_one_stored_event_and_evictions_are_removed() -> None:
    cache = PrefixCache(4, block_size=16)
    cache.events = []
    keys = sim_keys(PROMPT, 16, b"ns")
    cache.insert(keys[:2], None, PROMPT[:32])
    cache.insert(keys[1:4], keys[0], PROMPT[16:64])  # block 1 again, then two new
    first, second = cache.events
    assert first["block_hashes"] == keys[:2] and first["parent_block_hash"] is None
    assert first["token_ids"] == PROMPT[:32] and first["medium"] == "GPU"
    assert second["block_hashes"] == keys[2:4] and second["parent_block_hash"] == keys[1]
    assert second["token_ids"] == PROMPT[32:64]
    cache.insert(keys[4:], keys[3], PROMPT[64:])  # a fifth block in a cache of four
    removed = cache.events[-1]
    assert removed == {"type": "BlockRemoved", "block_hashes": [keys[0]], "medium": "GPU"}
    cache.reset()
    assert cache.events[-1] == {"type": "AllBlocksCleared"}


def test_the_proxy_reads_the_simulators_events_as_its_own_keys() -> None:
    cache = PrefixCache(64, block_size=16)
    cache.events = []
    keys = sim_keys(PROMPT, 16, b"ns")
    cache.insert(keys[:3], None, PROMPT[:48])
    cache.insert(keys[3:], keys[2], PROMPT[48:])
    payload = msgspec.msgpack.encode([0.0, cache.events, 0])  # as sim/kv_events.Publisher sends
    t = Translation("m")
    got = [k for e in decode(payload) if isinstance(e, Stored) for k in t.stored(e) or []]
    assert got == list(block_keys({"model": "m", "prompt": PROMPT}, COMPLETIONS, 16))


def test_events_are_recorded_only_when_asked_for() -> None:
    cache = PrefixCache(4, block_size=16)
    cache.insert(sim_keys(PROMPT, 16, b"ns"), None, PROMPT)
    assert cache.events is None and len(cache) == 4


def test_kv_events_config_as_vllm_reads_it() -> None:
    on = '{"enable_kv_cache_events": true, "publisher": "zmq", "endpoint": "tcp://*:5557", "topic": "p0"}'
    assert parse_events_config(on) == EventsConfig("tcp://*:5557", "p0")
    assert parse_events_config('{"enable_kv_cache_events": false}') is None
    assert parse_events_config(None) is None
    on = '{"enable_kv_cache_events": true, '
    for bad, says in (("{", "is not JSON"), (on + '"publisher": "null"}', "publishes zmq"),
                      (on + '"endpoint": "ipc:///x"}', "is not tcp://HOST:PORT")):  # fmt: skip
        with pytest.raises(UcmctlError, match=says):
            parse_events_config(bad)


def test_a_requests_block_tokens_span_its_prompt_then_its_answer() -> None:
    from ucmctl.sim.engine import SimRequest

    r = SimRequest(request_id="r", prompt=PROMPT[:40], max_tokens=30, keys=[], arrival=0.0)
    r.output = PROMPT[40:70]
    for start, stop in ((0, 1), (1, 3), (2, 4), (3, 4), (0, 4)):
        assert r.tokens_of(start, stop, 16) == (r.prompt + r.output)[start * 16 : stop * 16]


def test_an_endpoint_that_cannot_be_bound_is_one_line() -> None:
    import zmq

    from tests.support.processes import free_port
    from ucmctl.sim.kv_events import Publisher

    port = free_port()
    taken = zmq.Context.instance().socket(zmq.PUB)
    taken.setsockopt(zmq.LINGER, 0)
    taken.bind(f"tcp://127.0.0.1:{port}")
    try:
        with pytest.raises(UcmctlError) as refused:
            Publisher(EventsConfig(f"tcp://127.0.0.1:{port}"), 0)
        assert str(refused.value) == (
            f"--kv-events-config: cannot publish KV-cache events on tcp://127.0.0.1:{port}: "
            "Address already in use (give the endpoint a free port of this machine)"
        )
        with pytest.raises(UcmctlError, match=f"on tcp://127.0.0.1:{port}: "):
            Publisher(EventsConfig(f"tcp://127.0.0.1:{port - 1}"), 1)  # DP rank 1: the port plus 1
    finally:
        taken.close()
