# ruff: noqa: E501  (verbatim exposition lines)
"""KV capacity and preemptions from vLLM 0.32's Prometheus exposition, and the warning."""

from __future__ import annotations

import asyncio

import aiohttp
from aiohttp import web

from ucmctl.bench.capacity import (
    KvCapacity,
    capacity_warning,
    parse_capacity,
    parse_preemptions,
    read_capacities,
)
from ucmctl.bench.hitrate import Instance

# What vLLM 0.32 prints for a CPU run (block size 128, the CPU default) with
# --data-parallel-size 2: prometheus_client's output for log_metrics_info over
# CacheConfig.metrics_info(). The front end has already summed num_gpu_blocks over the two
# engines (2 x 1310), and both engines' lines carry that total.
VLLM_DP2 = """\
# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{_block_size_resolved="True",block_size="128",cache_dtype="auto",cache_hit_alignment_tokens="None",effective_attention_block_size="None",enable_mamba_shared_prefix_checkpoint="False",enable_prefix_caching="True",engine="0",gpu_memory_utilization="0.92",hash_block_size="None",is_attention_free="False",kv_cache_dtype_skip_layers="[]",kv_cache_layout="None",kv_cache_max_concurrency="40.94",kv_cache_memory_bytes="None",kv_cache_size_tokens="167680",kv_offloading_backend="native",kv_offloading_size="None",kv_sharing_fast_prefill="False",mamba_block_size="None",mamba_cache_dtype="auto",mamba_cache_mode="none",mamba_page_size_padded="None",mamba_ssm_cache_dtype="auto",num_cpu_blocks="None",num_gpu_blocks="2620",num_gpu_blocks_override="None",prefix_cache_retention_interval="0",prefix_caching_hash_algo="sha256",prefix_match_unit="None",replayssm_buffer_len="16",skip_page_size_padded="None",sliding_window="None",swa_bounded_replay="True",use_kda_recoverssm="False",use_replayssm="False",user_specified_block_size="False"} 1.0
vllm:cache_config_info{_block_size_resolved="True",block_size="128",cache_dtype="auto",cache_hit_alignment_tokens="None",effective_attention_block_size="None",enable_mamba_shared_prefix_checkpoint="False",enable_prefix_caching="True",engine="1",gpu_memory_utilization="0.92",hash_block_size="None",is_attention_free="False",kv_cache_dtype_skip_layers="[]",kv_cache_layout="None",kv_cache_max_concurrency="40.94",kv_cache_memory_bytes="None",kv_cache_size_tokens="167680",kv_offloading_backend="native",kv_offloading_size="None",kv_sharing_fast_prefill="False",mamba_block_size="None",mamba_cache_dtype="auto",mamba_cache_mode="none",mamba_page_size_padded="None",mamba_ssm_cache_dtype="auto",num_cpu_blocks="None",num_gpu_blocks="2620",num_gpu_blocks_override="None",prefix_cache_retention_interval="0",prefix_caching_hash_algo="sha256",prefix_match_unit="None",replayssm_buffer_len="16",skip_page_size_padded="None",sliding_window="None",swa_bounded_replay="True",use_kda_recoverssm="False",use_replayssm="False",user_specified_block_size="False"} 1.0
# HELP vllm:num_preemptions_total Cumulative number of preemption from the engine.
# TYPE vllm:num_preemptions_total counter
vllm:num_preemptions_total{engine="0",model_name="m"} 3.0
vllm:num_preemptions_total{engine="1",model_name="m"} 4.0
# HELP vllm:num_preemptions_created Cumulative number of preemption from the engine.
# TYPE vllm:num_preemptions_created gauge
vllm:num_preemptions_created{engine="0",model_name="m"} 1.7961495347142584e+09
vllm:num_preemptions_created{engine="1",model_name="m"} 1.7961495347142806e+09
"""


def test_parse_capacity_reads_vllm_dp2_exposition_once_not_per_engine() -> None:
    assert parse_capacity(VLLM_DP2) == (2620, 128)
    assert KvCapacity("i", "mixed", 2620, 128).tokens == 2620 * 128


def test_parse_capacity_absent_or_unparsable() -> None:
    assert parse_capacity("") == (None, None)
    assert parse_capacity('vllm:num_requests_running{engine="0",model_name="m"} 0\n') == (None, None)
    unset = VLLM_DP2.replace('num_gpu_blocks="2620"', 'num_gpu_blocks="None"')
    assert parse_capacity(unset) == (None, None)
    assert parse_capacity(VLLM_DP2.replace('block_size="128"', 'block_size="x"')) == (None, None)
    assert parse_capacity('vllm:cache_config_info_other{num_gpu_blocks="5",block_size="16"} 1.0') == (
        None,
        None,
    )
    assert KvCapacity("i", "mixed", None, 16).tokens is None


def test_parse_capacity_engines_disagreeing_takes_largest() -> None:
    text = (
        'vllm:cache_config_info{block_size="16",engine="0",num_gpu_blocks="100"} 1.0\n'
        'vllm:cache_config_info{block_size="16",engine="1",num_gpu_blocks="120"} 1.0\n'
    )
    assert parse_capacity(text) == (120, 16)


def test_parse_preemptions_sums_engines() -> None:
    assert parse_preemptions(VLLM_DP2) == 7.0  # not the _created gauge
    assert (
        parse_preemptions('vllm:num_preemptions{engine="0"} 2\nvllm:num_preemptions_total{engine="1"} 1\n')
        == 3.0
    )
    assert parse_preemptions("") == 0.0


def cap(name: str, role: str, blocks: int | None, size: int | None = 16) -> KvCapacity:
    return KvCapacity(name, role, blocks, size)


def test_capacity_warning_thresholds() -> None:
    decode = [cap("d0", "decode", 4096), cap("d1", "decode", 4096)]
    assert capacity_warning(decode, 131_072) is None  # equal: fits
    line = capacity_warning(decode, 131_073)
    assert line is not None and "\n" not in line and len(line) < 180
    assert line.startswith("warning:") and "131,073" in line and "131,072" in line
    assert "2 instances" in line and "8,192 blocks of 16" in line and "preemptions" in line


def test_capacity_warning_ignores_prefill_and_unknown() -> None:
    # prefill instances hold nothing while decoding, however large they are
    pd = [cap("p0", "prefill", 1_000_000), cap("d0", "decode", 100)]
    line = capacity_warning(pd, 1601)
    assert line is not None and "decode's KV cache holds 1,600 (1 instance," in line
    assert capacity_warning(pd, 1600) is None
    # no decode instances: every non-prefill instance counts
    mixed = [cap("a", "mixed", 100), cap("b", "mixed", 100), cap("c", "mixed", None)]
    assert capacity_warning(mixed, 3200) is None
    assert "mixed's KV cache holds 3,200 (2 instances" in (capacity_warning(mixed, 3201) or "")
    assert capacity_warning([cap("a", "decode", None), cap("p", "prefill", 10)], 10**9) is None
    assert capacity_warning([cap("s", "server", 10, None)], 10**9) is None
    assert capacity_warning([], 10**9) is None


def test_read_capacities_over_http() -> None:
    async def main() -> list[KvCapacity]:
        async def good(_: web.Request) -> web.Response:
            return web.Response(text=VLLM_DP2)

        async def broken(_: web.Request) -> web.Response:
            return web.Response(status=500)

        app = web.Application()
        app.router.add_get("/a/metrics", good)
        app.router.add_get("/b/metrics", broken)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = runner.addresses[0][1]
        base = f"http://127.0.0.1:{port}"
        instances = [
            Instance("a", "decode", f"{base}/a"),
            Instance("b", "decode", f"{base}/b"),
            Instance("c", "prefill", "http://127.0.0.1:1"),  # nothing listens
        ]
        try:
            async with aiohttp.ClientSession() as http:
                return await read_capacities(http, instances)
        finally:
            await runner.cleanup()

    got = asyncio.run(main())
    assert got == [
        cap("a", "decode", 2620, 128),
        cap("b", "decode", None, None),
        cap("c", "prefill", None, None),
    ]
    assert got[0].tokens == 335_360


def test_another_engines_names_are_read_and_vllms_ignored() -> None:
    import dataclasses

    from ucmctl.bench.hitrate import METRICS

    other = dataclasses.replace(METRICS, cache_config_info="eng:cache_info", preemptions="eng:preempted")
    text = VLLM_DP2.replace("vllm:cache_config_info", "eng:cache_info").replace(
        "vllm:num_preemptions", "eng:preempted"
    )
    assert parse_capacity(text, other) == (2620, 128)
    assert parse_preemptions(text, other) == 7.0
    assert parse_capacity(VLLM_DP2, other) == (None, None)  # vLLM's names are not this engine's
    assert parse_preemptions(VLLM_DP2, other) == 0.0
