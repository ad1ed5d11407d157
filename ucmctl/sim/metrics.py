"""Prometheus text exposition with vLLM's metric names, for what the simulator models."""

from __future__ import annotations

import bisect
import time
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ucmctl.sim.engine import Engine


# vLLM 0.32's `vllm:cache_config_info` labels: every CacheConfig field (CacheConfig.metrics_info(),
# str() of each value), here at CacheConfig()'s defaults, plus `engine`. exposition() fills in
# what the simulator knows; the rest keeps vLLM's default.
CACHE_CONFIG_DEFAULTS = {
    "_block_size_resolved": "True", "block_size": "16", "cache_dtype": "auto",
    "cache_hit_alignment_tokens": "None", "effective_attention_block_size": "None",
    "enable_mamba_shared_prefix_checkpoint": "False", "enable_prefix_caching": "True",
    "gpu_memory_utilization": "0.92", "hash_block_size": "None", "is_attention_free": "False",
    "kv_cache_dtype_skip_layers": "[]", "kv_cache_layout": "None", "kv_cache_max_concurrency": "None",
    "kv_cache_memory_bytes": "None", "kv_cache_size_tokens": "None", "kv_offloading_backend": "native",
    "kv_offloading_size": "None", "kv_sharing_fast_prefill": "False", "mamba_block_size": "None",
    "mamba_cache_dtype": "auto", "mamba_cache_mode": "none", "mamba_page_size_padded": "None",
    "mamba_ssm_cache_dtype": "auto", "num_cpu_blocks": "None", "num_gpu_blocks": "None",
    "num_gpu_blocks_override": "None", "prefix_cache_retention_interval": "0",
    "prefix_caching_hash_algo": "sha256", "prefix_match_unit": "None", "replayssm_buffer_len": "16",
    "skip_page_size_padded": "None", "sliding_window": "None", "swa_bounded_replay": "True",
    "use_kda_recoverssm": "False", "use_replayssm": "False", "user_specified_block_size": "True",
}  # fmt: skip


def cache_config_labels(engines: Sequence[Engine], engine: Engine) -> str:
    """One engine's label set, as vLLM prints it (sorted by name). As vLLM's front end does
    (core_client.py: "Sum num_gpu_blocks from all engines in DP case"), num_gpu_blocks is the
    sum over the server's engines and every engine's line repeats it; kv_cache_size_tokens
    stays per engine."""
    values = dict(CACHE_CONFIG_DEFAULTS)
    values["block_size"] = str(engine.block_size)
    values["enable_prefix_caching"] = str(engine.cache.enabled)
    values["num_gpu_blocks"] = str(sum(e.num_blocks for e in engines))
    values["kv_cache_size_tokens"] = str(engine.num_blocks * engine.block_size)
    values["engine"] = str(engine.index)
    return ",".join(f'{k}="{v}"' for k, v in sorted(values.items()))


def ttft_buckets() -> list[float]:
    return [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
            10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0]  # fmt: skip


def inter_token_buckets() -> list[float]:
    return [0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
            10.0, 20.0, 40.0, 80.0]  # fmt: skip


def request_latency_buckets() -> list[float]:
    """vLLM's buckets of the whole-request latencies (e2e, queue, prefill, decode)."""
    return [0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
            240.0, 480.0, 960.0, 1920.0, 7680.0]  # fmt: skip


class Histogram:
    """Cumulative-bucket histogram as Prometheus exposes it."""

    def __init__(self, buckets: Sequence[float]) -> None:
        self.buckets = list(buckets)
        self.counts = [0] * (len(self.buckets) + 1)
        self.total = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.buckets, value)] += 1
        self.total += value
        self.count += 1

    def lines(self, name: str, labels: str) -> Iterable[str]:
        running = 0
        for bound, n in zip(self.buckets, self.counts, strict=False):
            running += n
            yield f'{name}_bucket{{{labels},le="{bound}"}} {running}'
        yield f'{name}_bucket{{{labels},le="+Inf"}} {self.count}'
        yield f"{name}_count{{{labels}}} {self.count}"
        yield f"{name}_sum{{{labels}}} {self.total}"


STARTED = time.time()  # the process's start, as prometheus_client's process collector says it


def exposition(model: str, engines: Sequence[Engine]) -> str:
    out: list[str] = [
        "# HELP process_start_time_seconds Start time of the process since unix epoch in seconds.",
        "# TYPE process_start_time_seconds gauge",
        f"process_start_time_seconds {STARTED:.2f}",
    ]

    def family(name: str, kind: str, help_text: str) -> None:
        out.append(f"# HELP {name} {help_text}")
        out.append(f"# TYPE {name} {kind}")

    def labels(e: Engine) -> str:
        return f'engine="{e.index}",model_name="{model}"'

    gauges = [
        (
            "vllm:num_requests_running",
            "Number of requests in model execution batches.",
            lambda e: len(e.running),
        ),
        (
            "vllm:num_requests_waiting",
            "Number of requests waiting to be processed.",
            lambda e: len(e.waiting),
        ),
        (
            "vllm:kv_cache_usage_perc",
            "KV-cache usage. 1 means 100 percent usage.",
            lambda e: e.kv_usage,
        ),
    ]
    for name, help_text, value in gauges:
        family(name, "gauge", help_text)
        out.extend(f"{name}{{{labels(e)}}} {value(e)}" for e in engines)
    family("vllm:cache_config_info", "gauge", "Information of the LLMEngine CacheConfig")
    out.extend(f"vllm:cache_config_info{{{cache_config_labels(engines, e)}}} 1.0" for e in engines)
    counters = [
        ("vllm:prefix_cache_queries", "Prefix cache queries, in tokens.", lambda e: e.stats.prefix_queries),
        ("vllm:prefix_cache_hits", "Prefix cache hits, in tokens.", lambda e: e.stats.prefix_hits),
        ("vllm:external_prefix_cache_queries", "External prefix cache queries, in tokens.",
         lambda e: e.stats.external_queries),
        ("vllm:external_prefix_cache_hits", "External prefix cache hits, in tokens.",
         lambda e: e.stats.external_hits),
        ("vllm:prompt_tokens", "Number of prefill tokens processed.", lambda e: e.stats.prompt_tokens),
        ("vllm:generation_tokens", "Number of generation tokens processed.",
         lambda e: e.stats.generation_tokens),
        ("vllm:request_success", "Count of successfully processed requests.", lambda e: e.stats.finished),
        ("vllm:num_preemptions", "Cumulative number of preemption from the engine.",
         lambda e: e.stats.preemptions),
    ]  # fmt: skip
    for name, help_text, value in counters:
        family(f"{name}_total", "counter", help_text)
        out.extend(f"{name}_total{{{labels(e)}}} {value(e)}" for e in engines)
    # vLLM 0.32's breakdown of prompt tokens: every external hit (a UCM load or a P2P transfer)
    # is `external_kv_transfer`, as vLLM counts any connector's tokens there.
    name = "vllm:prompt_tokens_by_source"
    family(f"{name}_total", "counter", "Number of prompt tokens by source.")
    for e in engines:
        st = e.stats
        local = st.prompt_tokens - st.prefix_hits - st.external_hits
        for source, tokens in (("local_compute", local), ("local_cache_hit", st.prefix_hits),
                               ("external_kv_transfer", st.external_hits)):  # fmt: skip
            out.append(f'{name}_total{{{labels(e)},source="{source}"}} {tokens}')
    # The UCM connector's counters (ucm_connector.stats), for the server's one store.
    external = engines[0].external if engines else None
    if external is not None:
        for key, count in external.counts.items():
            name = f"vllm:ucm_{key}_total"
            family(name, "counter", f"UCM store: {key.replace('_', ' ')} (blocks)")
            out.append(f"{name}{{{labels(engines[0])}}} {count}")
        for key, amount in external.moved.items():
            name = f"vllm:ucm_{key}_total"
            family(name, "counter", f"UCM store: {key.replace('_', ' ')}")
            out.append(f"{name}{{{labels(engines[0])}}} {amount:.6g}")
        name = "ucmctl_sim_store_wait_max_seconds"
        family(name, "gauge", "The longest one UCM store lookup, load or save took.")
        for op, took in external.longest_wait_s.items():
            out.append(f'{name}{{{labels(engines[0])},op="{op}"}} {took:.3f}')
    # The simulator's own: how well it keeps its schedule (elapsed / planned - 1 is the lag).
    own = [
        ("ucmctl_sim_steps", "Engine steps run.", lambda e: e.stats.steps),
        ("ucmctl_sim_step_planned_seconds", "Simulated compute the steps asked for.",
         lambda e: e.stats.planned_ms / 1000),
        ("ucmctl_sim_step_elapsed_seconds", "Wall time the steps took.", lambda e: e.stats.elapsed_ms / 1000),
    ]  # fmt: skip
    for name, help_text, value in own:
        family(f"{name}_total", "counter", help_text)
        out.extend(f"{name}_total{{{labels(e)}}} {value(e)}" for e in engines)
    histograms = [
        ("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", "ttft"),
        ("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", "itl"),
        ("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.", "e2e"),
    ]
    for name, help_text, attr in histograms:
        family(name, "histogram", help_text)
        for e in engines:
            out.extend(getattr(e.stats, attr).lines(name, labels(e)))
    return "\n".join(out) + "\n"
