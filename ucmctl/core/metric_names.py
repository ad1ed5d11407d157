"""The Prometheus series ucmctl writes or reads, each name spelled here once.

- vLLM's (`vllm:`): what a server's /metrics says and ucmctl reads (the KV probe, bench's hit
  rates, time series and capacity check, the dashboards and alerts); the simulator writes the
  same. `ucmctl.engines` hands the ones an engine serves to the rest as its `Metrics`.
- The UCM connector's (`vllm:ucm_`): its transfer stats, exported through vLLM's metrics by the
  connector and by the simulator, read by bench, the store's error check and the alerts.
- The packaged Mooncake connector's (`vllm:mooncake_`).
- ucmctl's own: the proxy's (`ucmctl_proxy_`) and the simulator's (`ucmctl_sim_`).

vLLM's and the connectors' counters are named without their `_total` suffix (the exposition
adds it; readers take both); the proxy's are named as exposed. A leaf module: the node-side
programs and the connector import it.
"""

from __future__ import annotations

# prometheus_client's process collector (in vLLM's /metrics too): a restart changes it.
PROCESS_START = "process_start_time_seconds"

# ---- vLLM's -------------------------------------------------------------------------------------
VLLM_PREFIX = "vllm:"
REQUESTS_RUNNING = "vllm:num_requests_running"  # gauges
REQUESTS_WAITING = "vllm:num_requests_waiting"
KV_CACHE_USAGE = "vllm:kv_cache_usage_perc"
CACHE_CONFIG_INFO = "vllm:cache_config_info"  # an info series: num_gpu_blocks, block_size, ...
PREFIX_CACHE_QUERIES = "vllm:prefix_cache_queries"  # counters, in tokens
PREFIX_CACHE_HITS = "vllm:prefix_cache_hits"
EXTERNAL_PREFIX_CACHE_QUERIES = "vllm:external_prefix_cache_queries"
EXTERNAL_PREFIX_CACHE_HITS = "vllm:external_prefix_cache_hits"
PROMPT_TOKENS = "vllm:prompt_tokens"
GENERATION_TOKENS = "vllm:generation_tokens"
REQUEST_SUCCESS = "vllm:request_success"
PREEMPTIONS = "vllm:num_preemptions"
PROMPT_TOKENS_BY_SOURCE = "vllm:prompt_tokens_by_source"  # labelled by `source`:
KV_TRANSFER_SOURCE = "external_kv_transfer"  # the tokens that came through a KV connector
TIME_TO_FIRST_TOKEN = "vllm:time_to_first_token_seconds"  # histograms
INTER_TOKEN_LATENCY = "vllm:inter_token_latency_seconds"
E2E_REQUEST_LATENCY = "vllm:e2e_request_latency_seconds"

# ---- the UCM connector's: one counter per field of its transfer stats ---------------------------
UCM_PREFIX = "vllm:ucm_"
_UCM_RENAMED = {"load_s": "load_seconds", "save_s": "save_seconds"}


def ucm_counter(field: str) -> str:
    """The UCM connector's counter of its stats field `field` (`load_blocks`,
    `load_errors_estale`, `save_waits_over_bound`, ...; `load_s` is `..._load_seconds`)."""
    return UCM_PREFIX + _UCM_RENAMED.get(field, field)


# ---- the packaged Mooncake connector's: stats field -> counter ----------------------------------
MOONCAKE_COUNTERS = {
    "transfers": "vllm:mooncake_transfers",
    "bytes_transferred": "vllm:mooncake_bytes_transferred",
    "transfer_duration": "vllm:mooncake_transfer_seconds",
    "num_descriptors": "vllm:mooncake_descriptors",
    "num_failed_transfers": "vllm:mooncake_failed_transfers",
    "num_failed_recvs": "vllm:mooncake_failed_recvs",
    "num_kv_expired_reqs": "vllm:mooncake_expired_requests",
}

# ---- the proxy's, as exposed --------------------------------------------------------------------
PROXY_PREFIX = "ucmctl_proxy_"
PROXY_REQUESTS = "ucmctl_proxy_requests_total"  # by route
PROXY_ERRORS = "ucmctl_proxy_errors_total"  # by reason
PROXY_RETRIES = "ucmctl_proxy_retries_total"  # by leg
PROXY_FIRST_TOKEN_RETRIES = "ucmctl_proxy_first_token_retries_total"  # by leg
PROXY_PATHS = "ucmctl_proxy_requests_by_path_total"  # pd: disaggregated, or direct to a decode
PROXY_MIGRATIONS = "ucmctl_proxy_migrations_total"  # answers cut mid-stream, by outcome
PROXY_TTFT = "ucmctl_proxy_ttft_seconds"  # histograms
PROXY_REQUEST_LATENCY = "ucmctl_proxy_request_latency_seconds"
PROXY_PREFILL = "ucmctl_proxy_prefill_seconds"
PROXY_KV_HANDOVER = "ucmctl_proxy_kv_handover_seconds"
PROXY_MIGRATION_GAP = "ucmctl_proxy_migration_gap_seconds"
PROXY_INSTANCE_HEALTHY = "ucmctl_proxy_instance_healthy"  # per instance
PROXY_INSTANCE_DRAINING = "ucmctl_proxy_instance_draining"
PROXY_INSTANCE_STALLED = "ucmctl_proxy_instance_stalled"
PROXY_INSTANCE_STALLS = "ucmctl_proxy_instance_stalls_total"
PROXY_INSTANCE_IN_FLIGHT = "ucmctl_proxy_instance_requests_in_flight"
PROXY_INSTANCE_STREAMING = "ucmctl_proxy_instance_requests_streaming"
PROXY_INSTANCE_TOKENS = "ucmctl_proxy_instance_tokens_in_flight"
PROXY_INSTANCE_REQUESTS = "ucmctl_proxy_instance_requests_total"
PROXY_INSTANCE_FAILURES = "ucmctl_proxy_instance_failures_total"
PROXY_INSTANCE_OUTPUT_CHUNKS = "ucmctl_proxy_instance_output_chunks_total"
PROXY_INFO = "ucmctl_proxy_info"
PROXY_ROUTING = "ucmctl_proxy_routing_info"  # the policy and where it learns where the KV is
PROXY_KV_INDEX_BLOCKS = "ucmctl_proxy_kv_index_blocks"  # blocks the proxy's index knows of
PROXY_KV_EVENTS = "ucmctl_proxy_kv_events_total"  # per instance, by outcome: applied, bad, gap, ...
PROXY_KV_PREDICTED = "ucmctl_proxy_kv_predicted_tokens_total"  # per instance: prompt, local, external
PROXY_TOKENIZE = "ucmctl_proxy_tokenize_total"  # text prompts' /tokenize asks, by outcome

# ---- the simulator's own (counters without `_total`) --------------------------------------------
SIM_STEPS = "ucmctl_sim_steps"
SIM_STEP_PLANNED = "ucmctl_sim_step_planned_seconds"
SIM_STEP_ELAPSED = "ucmctl_sim_step_elapsed_seconds"
SIM_STORE_WAIT_MAX = "ucmctl_sim_store_wait_max_seconds"  # a gauge, by op
