"""Prometheus text exposition with vLLM's metric names, for what the simulator models."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from ucmctl.core import metric_names as names

if TYPE_CHECKING:
    from ucmctl.sim.engine import Engine
    from ucmctl.sim.external import ExternalTier


# vLLM 0.32's `vllm:cache_config_info` labels: every CacheConfig field (CacheConfig.metrics_info(),
# str() of each value), here at CacheConfig()'s defaults, plus `engine`. exposition() fills in
# what the simulator knows; the rest keeps vLLM's default.
CACHE_CONFIG_DEFAULTS = {
    "_block_size_resolved": "True",
    "block_size": "16",
    "cache_dtype": "auto",
    "cache_hit_alignment_tokens": "None",
    "effective_attention_block_size": "None",
    "enable_mamba_shared_prefix_checkpoint": "False",
    "enable_prefix_caching": "True",
    "gpu_memory_utilization": "0.92",
    "hash_block_size": "None",
    "is_attention_free": "False",
    "kv_cache_dtype_skip_layers": "[]",
    "kv_cache_layout": "None",
    "kv_cache_max_concurrency": "None",
    "kv_cache_memory_bytes": "None",
    "kv_cache_size_tokens": "None",
    "kv_offloading_backend": "native",
    "kv_offloading_size": "None",
    "kv_sharing_fast_prefill": "False",
    "mamba_block_size": "None",
    "mamba_cache_dtype": "auto",
    "mamba_cache_mode": "none",
    "mamba_page_size_padded": "None",
    "mamba_ssm_cache_dtype": "auto",
    "num_cpu_blocks": "None",
    "num_gpu_blocks": "None",
    "num_gpu_blocks_override": "None",
    "prefix_cache_retention_interval": "0",
    "prefix_caching_hash_algo": "sha256",
    "prefix_match_unit": "None",
    "replayssm_buffer_len": "16",
    "skip_page_size_padded": "None",
    "sliding_window": "None",
    "swa_bounded_replay": "True",
    "use_kda_recoverssm": "False",
    "use_replayssm": "False",
    "user_specified_block_size": "True",
}


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
    return [
        0.001,
        0.005,
        0.01,
        0.02,
        0.04,
        0.06,
        0.08,
        0.1,
        0.25,
        0.5,
        0.75,
        1.0,
        2.5,
        5.0,
        7.5,
        10.0,
        20.0,
        40.0,
        80.0,
        160.0,
        640.0,
        2560.0,
    ]


def inter_token_buckets() -> list[float]:
    return [
        0.01,
        0.025,
        0.05,
        0.075,
        0.1,
        0.15,
        0.2,
        0.3,
        0.4,
        0.5,
        0.75,
        1.0,
        2.5,
        5.0,
        7.5,
        10.0,
        20.0,
        40.0,
        80.0,
    ]


def request_latency_buckets() -> list[float]:
    """vLLM's buckets of the whole-request latencies (e2e, queue, prefill, decode)."""
    return [
        0.3,
        0.5,
        0.8,
        1.0,
        1.5,
        2.0,
        2.5,
        5.0,
        10.0,
        15.0,
        20.0,
        30.0,
        40.0,
        50.0,
        60.0,
        120.0,
        240.0,
        480.0,
        960.0,
        1920.0,
        7680.0,
    ]


STARTED = time.time()  # the process's start, as prometheus_client's process collector says it


# Per engine: (name, help, value). Counters are named without `_total`.
Row = tuple[str, str, Callable[["Engine"], float]]
GAUGES: tuple[Row, ...] = (
    (names.REQUESTS_RUNNING, "Number of requests in model execution batches.", lambda e: len(e.running)),
    (names.REQUESTS_WAITING, "Number of requests waiting to be processed.", lambda e: len(e.waiting)),
    (names.KV_CACHE_USAGE, "KV-cache usage. 1 means 100 percent usage.", lambda e: e.kv_usage),
)
COUNTERS: tuple[Row, ...] = (
    (names.PREFIX_CACHE_QUERIES, "Prefix cache queries, in tokens.", lambda e: e.stats.prefix_queries),
    (names.PREFIX_CACHE_HITS, "Prefix cache hits, in tokens.", lambda e: e.stats.prefix_hits),
    (names.EXTERNAL_PREFIX_CACHE_QUERIES, "External prefix cache queries, in tokens.",
     lambda e: e.stats.external_queries),
    (names.EXTERNAL_PREFIX_CACHE_HITS, "External prefix cache hits, in tokens.",
     lambda e: e.stats.external_hits),
    (names.PROMPT_TOKENS, "Number of prefill tokens processed.", lambda e: e.stats.prompt_tokens),
    (names.GENERATION_TOKENS, "Number of generation tokens processed.",
     lambda e: e.stats.generation_tokens),
    (names.REQUEST_SUCCESS, "Count of successfully processed requests.", lambda e: e.stats.finished),
    (names.PREEMPTIONS, "Cumulative number of preemption from the engine.",
     lambda e: e.stats.preemptions),
)  # fmt: skip
# The simulator's own: how well it keeps its schedule (elapsed / planned - 1 is the lag).
OWN_COUNTERS: tuple[Row, ...] = (
    (names.SIM_STEPS, "Engine steps run.", lambda e: e.stats.steps),
    (names.SIM_STEP_PLANNED, "Simulated compute the steps asked for.", lambda e: e.stats.planned_ms / 1000),
    (names.SIM_STEP_ELAPSED, "Wall time the steps took.", lambda e: e.stats.elapsed_ms / 1000),
)
HISTOGRAMS = (  # name, help, the engine's stats attribute
    (names.TIME_TO_FIRST_TOKEN, "Histogram of time to first token in seconds.", "ttft"),
    (names.INTER_TOKEN_LATENCY, "Histogram of inter-token latency in seconds.", "itl"),
    (names.E2E_REQUEST_LATENCY, "Histogram of e2e request latency in seconds.", "e2e"),
)


class _Page:
    """A /metrics page being written: families, each with its samples."""

    def __init__(self, model: str) -> None:
        self.model = model
        self.out: list[str] = []

    def family(self, name: str, kind: str, help_text: str) -> None:
        self.out.append(f"# HELP {name} {help_text}")
        self.out.append(f"# TYPE {name} {kind}")

    def labels(self, e: Engine) -> str:
        return f'engine="{e.index}",model_name="{self.model}"'

    def per_engine(self, kind: str, table: Sequence[Row], engines: Sequence[Engine]) -> None:
        suffix = "_total" if kind == "counter" else ""
        for name, help_text, value in table:
            self.family(name + suffix, kind, help_text)
            self.out.extend(f"{name}{suffix}{{{self.labels(e)}}} {value(e)}" for e in engines)


def exposition(model: str, engines: Sequence[Engine]) -> str:
    page = _Page(model)
    page.family(names.PROCESS_START, "gauge", "Start time of the process since unix epoch in seconds.")
    page.out.append(f"{names.PROCESS_START} {STARTED:.2f}")
    page.per_engine("gauge", GAUGES, engines)
    page.family(names.CACHE_CONFIG_INFO, "gauge", "Information of the LLMEngine CacheConfig")
    page.out.extend(f"{names.CACHE_CONFIG_INFO}{{{cache_config_labels(engines, e)}}} 1.0" for e in engines)
    page.per_engine("counter", COUNTERS, engines)
    _prompt_tokens_by_source(page, engines)
    external = engines[0].external if engines else None
    if external is not None:
        _store_counters(page, engines[0], external)
    page.per_engine("counter", OWN_COUNTERS, engines)
    for name, help_text, attr in HISTOGRAMS:
        page.family(name, "histogram", help_text)
        for e in engines:
            page.out.extend(getattr(e.stats, attr).lines(name, page.labels(e)))
    return "\n".join(page.out) + "\n"


def _prompt_tokens_by_source(page: _Page, engines: Sequence[Engine]) -> None:
    """vLLM 0.32's breakdown of prompt tokens: every external hit (a UCM load or a P2P transfer)
    is `external_kv_transfer`, as vLLM counts any connector's tokens there."""
    name = names.PROMPT_TOKENS_BY_SOURCE + "_total"
    page.family(name, "counter", "Number of prompt tokens by source.")
    for e in engines:
        st = e.stats
        local = st.prompt_tokens - st.prefix_hits - st.external_hits
        for source, tokens in (
            ("local_compute", local),
            ("local_cache_hit", st.prefix_hits),
            (names.KV_TRANSFER_SOURCE, st.external_hits),
        ):
            page.out.append(f'{name}{{{page.labels(e)},source="{source}"}} {tokens}')


def _store_counters(page: _Page, engine: Engine, external: ExternalTier) -> None:
    """The UCM connector's counters (ucm_connector.stats), for the server's one store."""
    labels = page.labels(engine)
    for key, count in external.counts.items():
        name = names.ucm_counter(key) + "_total"
        page.family(name, "counter", f"UCM store: {key.replace('_', ' ')} (blocks)")
        page.out.append(f"{name}{{{labels}}} {count}")
    for key, amount in external.moved.items():
        name = names.ucm_counter(key) + "_total"
        page.family(name, "counter", f"UCM store: {key.replace('_', ' ')}")
        page.out.append(f"{name}{{{labels}}} {amount:.6g}")
    name = names.SIM_STORE_WAIT_MAX
    page.family(name, "gauge", "The longest one UCM store lookup, load or save took.")
    for op, took in external.longest_wait_s.items():
        page.out.append(f'{name}{{{labels},op="{op}"}} {took:.3f}')
