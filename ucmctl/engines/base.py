"""What an engine means to ucmctl: one API server's structured spec, and the `Engine` that turns
it into a command line and knows the engine's flags, KV-transfer config, metrics and probes.

The Plan keeps each server's `ServerSpec` (plan/model.py `Process.server`), so everything after
planning (the plan's argv, `render --k8s`) builds command lines from it through the engine,
never by editing strings. An engine is one module and one line in `engines/__init__.py`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict


class ServerSpec(BaseModel):
    """One API server as the engine is asked to serve it: what ucmctl decides (address, ports,
    parallelism, the KV connectors) and the topology's extra flags, as written there."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    executable: list[str]  # the engine's command as the node runs it (`.../vllm serve`)
    model: str
    host: str
    port: int
    served_model_name: str | None = None
    dtype: str | None = None  # None: the engine's own choice ("auto")
    data_parallel_size: int = 1
    # External DP (one API server per rank): the rank, its group's master and RPC port. A
    # scheduler's template may give the rank as a word its shell expands (render --k8s).
    data_parallel_rank: int | str | None = None
    data_parallel_address: str | None = None
    data_parallel_rpc_port: int | None = None
    tensor_parallel_size: int = 1
    enable_expert_parallel: bool = False
    flags: dict[str, Any] = {}  # the topology's extra flags: true is a bare flag, false --no-flag
    kv_transfer_config: dict[str, Any] | None = None  # the engine's connector config (JSON)
    kv_events_config: dict[str, Any] | None = None  # the engine's KV-cache event publisher (JSON)

    @property
    def external_dp(self) -> bool:
        return self.data_parallel_rank is not None


class MooncakeLeg(BaseModel):
    """A server's side of a Mooncake P2P transfer, as the topology decides it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    connector: str  # the kv_connector name (engines/mooncake.py)
    role: Literal["kv_producer", "kv_consumer"]
    guides_keys: bool  # vllm-ascend's MooncakeConnectorV1: kv_port and the sides' dp/tp
    kv_port: int | None = None
    parallel: dict[str, dict[str, int]] = {}  # guides_keys: {"prefill": {"dp_size", "tp_size"}, ...}
    protocol: str = "tcp"
    device_name: str | None = None
    num_workers: int | None = None


class KvTransfer(BaseModel):
    """Which KV connectors a server loads: the UCM store's (its config file) and Mooncake's."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    ucm_config: str | None = None
    mooncake: MooncakeLeg | None = None


@dataclass(frozen=True)
class Metrics:
    """The names of the Prometheus series ucmctl reads from a server (the KV probe, the hit
    rates, the time series, the capacity check): counters without their `_total` suffix. An
    engine builds them from the catalog, ucmctl.core.metric_names."""

    requests_running: str  # gauges
    requests_waiting: str
    kv_cache_usage: str
    local_queries: str
    local_hits: str
    external_queries: str
    external_hits: str
    preemptions: str
    cache_config_info: str  # an info series whose labels carry num_gpu_blocks and block_size
    prompt_tokens_by_source: str  # labelled by source; the KV-transfer one counts P2P tokens
    transfer_source: str  # that label's value for tokens that came through the KV connector


class Engine:
    """An engine ucmctl can serve with. Subclasses set the facts and may override the methods."""

    name: str
    health_timeout: float  # seconds a server may take to answer its health checks
    metrics: Metrics
    # Flags ucmctl derives from the topology (the key to set instead), and environment likewise.
    managed_flags: dict[str, str]
    managed_env: dict[str, str]
    # The variable that gives a CPU server its cores (None: the engine does not bind them).
    cpu_binding_variable: str | None = None
    loads_ucm_connector: bool = True  # a store user loads the packaged connector (preflight)
    one_version: bool = True  # preflight refuses nodes whose engine versions differ
    version_probe: str  # Python that prints `engine=<version>` (preflight), or raises
    display_name: str  # in preflight's "... is not installed"
    bootstrap_port_variable: str  # a P2P prefill server's Mooncake bootstrap port
    host_ip_variable: str  # the address a P2P server announces to its peers
    cache_root_variable: str | None = None  # where the engine keeps its caches (kept across starts)

    def platform_env(self, platform: str, run_dir: str) -> dict[str, str]:
        """The engine's own variables on a node of `platform` whose run directory is `run_dir`."""
        return {}

    def executable(self, python: str, tool: Callable[[str], str]) -> list[str]:
        """The command that serves, on a node with `python` and its console scripts (`tool`)."""
        raise NotImplementedError

    def argv(self, spec: ServerSpec) -> list[str]:
        raise NotImplementedError

    def kv_transfer_config(self, kv: KvTransfer) -> dict[str, Any] | None:
        return None
