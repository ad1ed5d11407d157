from __future__ import annotations

import json

import pytest

from tests.support.openai_checks import metric
from ucmctl.core.errors import UcmctlError
from ucmctl.sim.args import parse_serve_args
from ucmctl.sim.engine import Engine
from ucmctl.sim.metrics import exposition
from ucmctl.sim.prefix_cache import PrefixCache, block_keys
from ucmctl.sim.profile import Profile, load_profile


def test_block_keys_name_the_whole_prefix() -> None:
    a = block_keys(list(range(40)), 16, b"ns")
    b = block_keys(list(range(32)) + [99] * 8, 16, b"ns")
    c = block_keys([7, *range(1, 40)], 16, b"ns")
    assert len(a) == 2 and all(len(k) == 16 for k in a)  # the partial third block has no key
    assert a == b  # same first 32 tokens
    assert a[0] != c[0] and a[1] != c[1]  # a change in block 0 changes every later key
    assert block_keys(list(range(40)), 16, b"other") != a


def test_prefix_cache_matches_leading_blocks_and_evicts_least_recent() -> None:
    cache = PrefixCache(capacity_blocks=3)
    cache.insert([b"a", b"b", b"c"])
    assert cache.match([b"a", b"b", b"x", b"c"]) == 2
    cache.match([b"a"])  # a is now the most recent; b, then c were used before
    cache.insert([b"d"])
    assert cache.evictions == 1
    assert cache.match([b"c"]) == 0 or cache.match([b"b"]) == 0
    assert cache.match([b"a"]) == 1 and cache.match([b"d"]) == 1
    disabled = PrefixCache(capacity_blocks=10, enabled=False)
    disabled.insert([b"a"])
    assert disabled.match([b"a"]) == 0


def test_profile_costs() -> None:
    p = Profile(base_ms=1, prefill_us_per_token=100, prefill_attn_ns=10, decode_step_ms=5, decode_seq_us=50)
    assert p.prefill_ms(1000, 0) == pytest.approx(1000 * (100 + 10 * 500 / 1000) / 1000)
    assert p.prefill_ms(1000, 3000) > p.prefill_ms(1000, 0)  # later tokens attend to more context
    assert p.decode_ms(0, 0) == 0
    assert p.decode_ms(4, 0) == pytest.approx(5 + 0.2)
    assert load_profile("zero").prefill_ms(10_000, 10_000) == 0


def test_medium_cpu_profile_ships() -> None:
    p = load_profile("medium-cpu")
    assert p.prefill_us_per_token > 0 and p.decode_step_ms > 0 and p.source


def test_args_from_a_rendered_command_line() -> None:
    kv = {
        "kv_connector": "MultiConnector",
        "kv_role": "kv_producer",
        "kv_connector_extra_config": {
            "connectors": [
                {"kv_connector": "MooncakeConnector", "kv_role": "kv_producer", "kv_port": 20001},
                {
                    "kv_connector": "UCMConnector",
                    "kv_connector_extra_config": {"UCM_CONFIG_FILE": "/x/u.yaml"},
                },
            ]
        },
    }
    argv = ["/models/m", "--host", "0.0.0.0", "--port", "9001", "--data-parallel-size", "4",
            "--data-parallel-rank", "1", "--tensor-parallel-size", "8", "--gpu-memory-utilization", "0.92",
            "--block-size", "128", "--no-enable-prefix-caching", "--enforce-eager", "--kv-transfer-config",
            json.dumps(kv), "--kv-cache-gib", "1"]  # fmt: skip
    config, ignored = parse_serve_args(argv)
    assert ignored == ["--gpu-memory-utilization", "--enforce-eager"]
    assert (config.port, config.block_size, config.prefix_caching) == (9001, 128, False)
    assert config.data_parallel_size == 1  # an external DP rank is one engine
    assert config.ucm_config_file == "/x/u.yaml" and config.kv_role == "kv_producer"
    assert config.kv_cache_blocks == 2**30 // (1024 * 128)
    internal, _ = parse_serve_args(["/m", "--data-parallel-size", "2"])
    assert internal.data_parallel_size == 2
    assert config.host == "0.0.0.0"  # every interface when the command line asks for it
    assert internal.host == "127.0.0.1"  # and loopback, not every interface, when it says nothing
    assert config.load_seconds == 0.0
    assert parse_serve_args(["/m", "--load-seconds", "2.5"])[0].load_seconds == 2.5


def test_bad_args_are_user_errors() -> None:
    with pytest.raises(UcmctlError, match="no sim profile 'nope'"):
        parse_serve_args(["/m", "--profile", "nope"])
    with pytest.raises(UcmctlError, match="not JSON"):
        parse_serve_args(["/m", "--kv-transfer-config", "{oops"])
    with pytest.raises(UcmctlError, match="--load-seconds must be between 0 and 3600"):
        parse_serve_args(["/m", "--load-seconds", "-1"])


def test_exposition() -> None:
    engine = Engine(0, Profile(), block_size=16, max_num_seqs=4, max_num_batched_tokens=64,
                    cache=PrefixCache(8), external=None, vocab=100)  # fmt: skip
    engine.stats.prefix_queries, engine.stats.prefix_hits = 100, 48
    text = exposition("m", [engine])
    assert metric(text, "vllm:prefix_cache_queries_total") == 100
    assert metric(text, "vllm:prefix_cache_hits_total") == 48
    assert 'vllm:num_requests_running{engine="0",model_name="m"} 0' in text
    engine.stats.ttft.observe(0.3)
    ttft = [line for line in exposition("m", [engine]).splitlines() if "time_to_first_token" in line]
    assert ttft[-2:] == [  # as prometheus_client writes them: _count, then _sum
        'vllm:time_to_first_token_seconds_count{engine="0",model_name="m"} 1',
        'vllm:time_to_first_token_seconds_sum{engine="0",model_name="m"} 0.3',
    ]


def test_a_step_pays_one_fixed_cost_when_it_prefills_beside_streams() -> None:
    """A step's fixed cost is paid once: a prompt computed beside streams that decode costs the
    larger of the prefill and decode fixed costs, not both (the real vLLM's streams stalled 62-69
    ms beside a 320-token prompt; both charged made the simulator's 93 ms)."""
    import asyncio

    from ucmctl.sim.engine import SimRequest

    p = Profile(base_ms=20, prefill_us_per_token=100, decode_step_ms=15, decode_seq_us=1000)
    engine = Engine(0, p, block_size=16, max_num_seqs=8, max_num_batched_tokens=4096,
                    cache=PrefixCache(64), external=None, vocab=100)  # fmt: skip

    def streaming(i: int) -> SimRequest:
        r = SimRequest(f"s{i}", [5] * 32, 50, [], computed=32, admitted=True, generated=3)
        r.output = [7, 7, 7]
        return r

    async def step_ms(streams: int, prompt: int) -> float:
        engine.running = [streaming(i) for i in range(streams)]
        engine.waiting.clear()
        if prompt:
            engine.waiting.append(SimRequest("p", [9] * prompt, 1, []))
        return (await engine._schedule())[2]

    assert asyncio.run(step_ms(4, 0)) == pytest.approx(15 + 4)  # decode alone: its fixed cost
    assert asyncio.run(step_ms(0, 320)) == pytest.approx(20 + 32)  # prefill alone: its own
    assert asyncio.run(step_ms(4, 320)) == pytest.approx(20 + 32 + 4)  # both: the larger, once
