"""vLLM: `vllm serve`'s command line, the flags ucmctl manages, the KV-transfer config of the UCM
connector and of Mooncake (engines/mooncake.py says which connector reads what), the metrics
ucmctl reads and preflight's version probe."""

from __future__ import annotations

import json
import posixpath
from collections.abc import Callable
from typing import Any

from ucmctl.core import metric_names as names
from ucmctl.engines.base import Engine, KvTransfer, Metrics, MooncakeLeg, ServerSpec

# The packaged connectors, as vLLM loads them (`kv_connector_module_path`).
CONNECTOR_MODULE = "ucm_connector.connector"
MOONCAKE_MODULE = "ucm_connector.mooncake"

VLLM_METRICS = Metrics(
    requests_running=names.REQUESTS_RUNNING,
    requests_waiting=names.REQUESTS_WAITING,
    kv_cache_usage=names.KV_CACHE_USAGE,
    local_queries=names.PREFIX_CACHE_QUERIES,
    local_hits=names.PREFIX_CACHE_HITS,
    external_queries=names.EXTERNAL_PREFIX_CACHE_QUERIES,
    external_hits=names.EXTERNAL_PREFIX_CACHE_HITS,
    preemptions=names.PREEMPTIONS,
    cache_config_info=names.CACHE_CONFIG_INFO,
    prompt_tokens_by_source=names.PROMPT_TOKENS_BY_SOURCE,
    transfer_source=names.KV_TRANSFER_SOURCE,
)

# vLLM flags that ucmctl derives from the topology: the key to set instead.
MANAGED_FLAGS = {
    "host": "nodes.<name>.host (ucmctl binds every server itself)",
    "port": "<side>.port",
    "dtype": "model.dtype or <side>.dtype",
    "tensor-parallel-size": "<side>.tp",
    "data-parallel-size": "<side>.dp",
    "data-parallel-rank": "<side>.dp (ranks are numbered node by node)",
    "data-parallel-address": "<side>.nodes (the first node of a DP group is its master)",
    "data-parallel-rpc-port": "<side>.dp_rpc_port",
    "data-parallel-size-local": "<side>.servers_per_node",
    "kv-transfer-config": "mode and storage (ucmctl writes the connector config)",
    "served-model-name": "model.served_name",
    "enable-expert-parallel": "<side>.expert_parallel",
}
# Environment that ucmctl derives from the topology (the proxy and checks rely on it): the key to
# set instead.
MANAGED_ENV = {
    "VLLM_MOONCAKE_BOOTSTRAP_PORT": "prefill.bootstrap_port (the proxy asks each prefiller's port)",
    "MOONCAKE_CONFIG_PATH": "the mooncake section (ucmctl writes mooncake.json)",
}


def flag_words(flags: dict[str, Any]) -> list[str]:
    """YAML flags -> argv: true is a bare flag, false `--no-flag`, maps and lists are JSON."""
    out: list[str] = []
    for key, value in flags.items():
        flag = "--" + key.removeprefix("--")
        if value is True or value is None:
            out.append(flag)
        elif value is False:
            out.append("--no-" + flag[2:])
        elif isinstance(value, (dict, list)):
            out += [flag, json.dumps(value, separators=(",", ":"))]
        else:
            out += [flag, str(value)]
    return out


class VllmEngine(Engine):
    name = "vllm"
    display_name = "vLLM"
    health_timeout = 900.0  # a real engine loads weights and compiles
    metrics = VLLM_METRICS
    managed_flags = MANAGED_FLAGS
    managed_env = MANAGED_ENV
    cpu_binding_variable: str | None = "VLLM_CPU_OMP_THREADS_BIND"
    version_probe = 'import importlib.metadata as m; print("engine=" + m.version("vllm"))'
    bootstrap_port_variable = "VLLM_MOONCAKE_BOOTSTRAP_PORT"
    host_ip_variable = "VLLM_HOST_IP"
    cache_root_variable = "VLLM_CACHE_ROOT"

    def platform_env(self, platform: str, run_dir: str) -> dict[str, str]:
        if platform != "cpu":
            return {}
        return {
            "VLLM_TARGET_DEVICE": "cpu",
            # Otherwise vLLM keeps one core idle, halving prefill speed on small machines.
            "VLLM_CPU_NUM_OF_RESERVED_CPU": "0",
            "VLLM_CACHE_ROOT": posixpath.join(run_dir, "vllm-cache"),
        }

    def executable(self, python: str, tool: Callable[[str], str]) -> list[str]:
        return [tool("vllm"), "serve"]

    def argv(self, spec: ServerSpec) -> list[str]:
        argv = [*spec.executable, spec.model, "--host", spec.host, "--port", str(spec.port)]
        if spec.served_model_name:
            argv += ["--served-model-name", spec.served_model_name]
        if spec.dtype is not None:
            argv += ["--dtype", spec.dtype]
        argv += ["--data-parallel-size", str(spec.data_parallel_size)]
        if spec.external_dp:
            argv += [
                "--data-parallel-rank", str(spec.data_parallel_rank),
                "--data-parallel-address", str(spec.data_parallel_address),
                "--data-parallel-rpc-port", str(spec.data_parallel_rpc_port),
            ]  # fmt: skip
        argv += ["--tensor-parallel-size", str(spec.tensor_parallel_size)]
        if spec.enable_expert_parallel:
            argv.append("--enable-expert-parallel")
        argv += flag_words(spec.flags)
        if spec.kv_transfer_config is not None:
            argv += ["--kv-transfer-config", json.dumps(spec.kv_transfer_config)]
        if spec.kv_events_config is not None:
            argv += ["--kv-events-config", json.dumps(spec.kv_events_config)]
        return argv

    def kv_transfer_config(self, kv: KvTransfer) -> dict[str, Any] | None:
        ucm = None if kv.ucm_config is None else _ucm_connector(kv.ucm_config)
        if kv.mooncake is None:
            return ucm
        mooncake = _mooncake(kv.mooncake, with_metrics=ucm is not None)
        if ucm is None:
            return mooncake
        return {
            "kv_connector": "MultiConnector",
            "kv_role": "kv_producer",
            "kv_load_failure_policy": "recompute",
            "kv_connector_extra_config": {"connectors": [mooncake, ucm]},
        }


def _ucm_connector(ucm_config: str) -> dict[str, Any]:
    return {
        "kv_connector": "UCMConnector",
        "kv_role": "kv_both",
        "kv_connector_module_path": CONNECTOR_MODULE,
        "kv_connector_extra_config": {"UCM_CONFIG_FILE": ucm_config},
        # A block the store cannot deliver is recomputed, never a failed request. vLLM reads the
        # top level's policy; inside a MultiConnector the child carries it too, so the
        # connector's own check of it sees the same value.
        "kv_load_failure_policy": "recompute",
    }


def _mooncake(leg: MooncakeLeg, *, with_metrics: bool) -> dict[str, Any]:
    if leg.guides_keys:  # vllm-ascend's MooncakeConnectorV1: the guides' keys
        return {
            "kv_connector": leg.connector,
            "kv_role": leg.role,
            "kv_port": leg.kv_port,
            "kv_connector_extra_config": dict(leg.parallel),
        }
    # vLLM's MooncakeConnector reads only these
    extra: dict[str, Any] = {"mooncake_protocol": leg.protocol}
    if leg.device_name:
        extra["device_name"] = leg.device_name
    if leg.num_workers is not None:
        extra["num_workers"] = leg.num_workers
    mooncake: dict[str, Any] = {
        "kv_connector": leg.connector,
        "kv_role": leg.role,
        "kv_connector_extra_config": extra,
    }
    if with_metrics:
        # Same connector, plus the Prometheus metrics MultiConnector requires of every child
        # that reports transfer stats (vLLM's has none yet).
        mooncake["kv_connector_module_path"] = MOONCAKE_MODULE
    return mooncake
