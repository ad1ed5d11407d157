"""The rendered commands, flag by flag, against the commands in the guides (../shared/seeds).

The guide commands below are the guides' own, with their example paths. Where ucmctl adds
something (the connector module path, the load-failure policy, the Mooncake metrics port) or
places a file itself (UCM_CONFIG_FILE, MOONCAKE_CONFIG_PATH), the test says so.
"""

from __future__ import annotations

import json
import shlex
from typing import Any
from urllib.parse import urlsplit

from ucmctl.plan.model import Plan, Process, Stage

UCM_KV = {
    "kv_connector": "UCMConnector",
    "kv_role": "kv_both",
    "kv_connector_extra_config": {"UCM_CONFIG_FILE": "/path/to/ucm_config_example.yaml"},
}

CENTRALIZED_PREFILL = """vllm serve /models/QwQ-32B --host 0.0.0.0 --port 7800
 --gpu-memory-utilization 0.92 --data-parallel-size 1 --tensor-parallel-size 4 --seed 1024
 --max-model-len 17000 --max-num-batched-tokens 8000 --max-num-seqs 20 --trust-remote-code
 --enforce-eager"""
CENTRALIZED_DECODE = """vllm serve /models/QwQ-32B --host 0.0.0.0 --port 7802
 --gpu-memory-utilization 0.92 --data-parallel-size 1 --tensor-parallel-size 4 --seed 1024
 --max-model-len 17000 --max-num-batched-tokens 8000 --max-num-seqs 20 --trust-remote-code
 --compilation-config '{"cudagraph_mode":"FULL_DECODE_ONLY"}'"""
P2P_PREFILL = """vllm serve /models/QwQ-32B --host 0.0.0.0 --port 9000
 --gpu-memory-utilization 0.92 --data-parallel-size 1 --tensor-parallel-size 4 --seed 1024
 --max-model-len 17000 --max-num-batched-tokens 8000 --max-num-seqs 20 --trust-remote-code
 --enforce-eager"""
P2P_DECODE = """vllm serve /models/QwQ-32B --host 0.0.0.0 --port 9000 --data-parallel-size 1
 --tensor-parallel-size 4 --seed 1024 --max-model-len 17000 --max-num-batched-tokens 8000
 --trust-remote-code --max-num-seqs 4 --gpu-memory-utilization 0.92
 --compilation-config '{"cudagraph_mode":"FULL_DECODE_ONLY"}'"""
MIXED = """vllm serve /models/QwQ-32B --host 0.0.0.0 --port 7800 --gpu-memory-utilization 0.92
 --data-parallel-size 2 --tensor-parallel-size 4 --seed 1024 --max-model-len 17000
 --max-num-batched-tokens 8000 --max-num-seqs 20 --trust-remote-code --enforce-eager
 --block-size 128"""
ONE_P_ONE_D = """vllm serve /home/models/Qwen2.5-7B-Instruct --max-model-len 20000
 --tensor-parallel-size 1 --gpu_memory_utilization 0.87 --block-size 128 --port 7800"""
EP_COMMON = """--host 0.0.0.0 --tensor-parallel-size {tp} --enable-expert-parallel --seed 1024
 --max-model-len 17000 --max-num-batched-tokens 8000 --trust-remote-code --max-num-seqs 4
 --gpu-memory-utilization 0.92 --quantization ascend"""
EP_PREFILL = (
    "vllm serve /models/GLM-5.1-w4a8 "
    + EP_COMMON.format(tp=8)
    + """ --enforce-eager
 --additional-config '{"enable_weight_nz_layout":true,"enable_prefill_optimizations":true}'"""
)
EP_DECODE = (
    "vllm serve /models/GLM-5.1-w4a8 "
    + EP_COMMON.format(tp=4)
    + """
 --compilation-config '{"cudagraph_mode":"FULL_DECODE_ONLY"}'"""
)
MOONCAKE_MASTER = """mooncake_master --port 50088 --eviction_high_watermark_ratio 0.9
 --eviction_ratio 0.1 --default_kv_lease_ttl 11000"""
MOONCAKE_JSON = {
    "metadata_server": "P2PHANDSHAKE",
    "protocol": "ascend",
    "device_name": "",
    "master_server_address": "192.168.10.1:50088",
    "global_segment_size": "1GB",
}


def flags(argv: list[str]) -> dict[str, str | None]:
    """`--a 1 --b` -> {'a': '1', 'b': None}; underscores and dashes are the same to vLLM."""
    out: dict[str, str | None] = {}
    for i, word in enumerate(argv):
        if word.startswith("--"):
            nxt = argv[i + 1] if i + 1 < len(argv) else None
            out[word[2:].replace("_", "-")] = None if nxt is None or nxt.startswith("--") else nxt
    return out


def assert_command(process: Process, guide: str, **changes: str | None) -> None:
    """Every flag of the guide's command appears with the guide's value (or the change named)."""
    expected = shlex.split(guide)
    assert process.argv[1:3] == expected[1:3], "subcommand and model"
    ours, theirs = flags(process.argv), flags(expected)
    if "host" in theirs:  # the guides bind 0.0.0.0; ucmctl binds the address the node is reached at
        theirs["host"] = urlsplit(str(process.url)).hostname
    theirs.update({k.replace("_", "-"): v for k, v in changes.items()})
    for key, value in theirs.items():
        assert key in ours, f"{process.name}: --{key} missing"
        if key.endswith("-config") and value is not None:
            assert json.loads(str(ours[key])) == json.loads(value), f"{process.name}: --{key}"
        else:
            assert ours[key] == value, f"{process.name}: --{key} is {ours[key]!r}, guide {value!r}"


def kv_config(process: Process) -> dict[str, Any]:
    return json.loads(str(flags(process.argv)["kv-transfer-config"]))


def assert_ucm_connector(cfg: dict[str, Any], process: Process) -> None:
    """The guides' UCM connector JSON, with ucmctl's module path and config file placed in."""
    assert {k: cfg[k] for k in ("kv_connector", "kv_role")} == {
        k: UCM_KV[k] for k in ("kv_connector", "kv_role")
    }
    assert cfg["kv_connector_module_path"] == "ucm_connector.connector"
    path = cfg["kv_connector_extra_config"]["UCM_CONFIG_FILE"]
    assert path in {f.path for f in process.files}, "the config file is placed next to the process"


def test_centralized_2p2d(plans: dict[str, Plan]) -> None:
    plan = plans["2p2d-centralized"]
    p0, p1, d0, d1 = (plan.process(n) for n in ("prefill-0", "prefill-1", "decode-0", "decode-1"))
    assert_command(p0, CENTRALIZED_PREFILL)
    assert_command(p1, CENTRALIZED_PREFILL, port="7801")  # "modify --port (e.g. 7801)"
    assert_command(d0, CENTRALIZED_DECODE)
    assert_command(d1, CENTRALIZED_DECODE, port="7803")
    assert (p0.node, p1.node, d0.node, d1.node) == ("a", "a", "b", "b")
    # ... "and ASCEND_RT_VISIBLE_DEVICES": the second instance takes the next four cards.
    assert p0.env["ASCEND_RT_VISIBLE_DEVICES"] == "0,1,2,3"
    assert p1.env["ASCEND_RT_VISIBLE_DEVICES"] == "4,5,6,7"
    assert d1.env["ASCEND_RT_VISIBLE_DEVICES"] == "4,5,6,7"
    for p in (p0, p1, d0, d1):
        assert p.env["PYTHONHASHSEED"] == "123456"
        cfg = kv_config(p)
        assert_ucm_connector(cfg, p)
        assert cfg["kv_load_failure_policy"] == "recompute"  # ucmctl: a bad block is recomputed
        ucm = next(f for f in p.files if f.path.endswith("ucm_config.yaml")).content
        assert 'store_pipeline: "Cache|Posix"' in ucm and 'storage_backends: "/mnt/test1"' in ucm
        assert "cache_buffer_capacity_gb: 64" in ucm and "use_layerwise: false" in ucm
    proxy = plan.process("proxy")
    assert flags(proxy.argv)["port"] == "7805" and proxy.node == "a"
    assert _proxy_targets(proxy) == (
        ["192.168.10.1:7800", "192.168.10.1:7801"],
        ["192.168.10.2:7802", "192.168.10.2:7803"],
    )


def _proxy_targets(proxy: Process) -> tuple[list[str], list[str]]:
    pre, dec = [], []
    for flag, url in zip(proxy.argv, proxy.argv[1:], strict=False):
        if flag in ("--prefiller", "--decoder"):
            (pre if flag == "--prefiller" else dec).append(url.removeprefix("http://"))
    return pre, dec


def test_p2p_2p2d(plans: dict[str, Plan]) -> None:
    plan = plans["2p2d-p2p"]
    master = plan.process("mooncake-master")
    assert master.node == "a" and master.stage is Stage.mooncake
    assert_command_plain(master, MOONCAKE_MASTER)
    p0, p1, d0, d1 = (plan.process(n) for n in ("prefill-0", "prefill-1", "decode-0", "decode-1"))
    assert_command(p0, P2P_PREFILL)
    assert_command(p1, P2P_PREFILL, port="9001")
    assert_command(d0, P2P_DECODE)
    assert_command(d1, P2P_DECODE, port="9001")
    for p in (p0, p1, d0, d1):
        assert p.env["PYTHONHASHSEED"] == "0"
        assert p.depends_on == ["mooncake-master"]
        mooncake_json = next(f for f in p.files if f.path == p.env["MOONCAKE_CONFIG_PATH"])
        assert json.loads(mooncake_json.content) == MOONCAKE_JSON
    pre = kv_config(p0)
    assert (pre["kv_connector"], pre["kv_role"]) == ("MultiConnector", "kv_producer")
    mooncake, ucm = pre["kv_connector_extra_config"]["connectors"]
    assert mooncake == {
        "kv_connector": "MooncakeConnectorV1",
        "kv_role": "kv_producer",
        "kv_port": 20001,
        "kv_connector_extra_config": {
            "prefill": {"dp_size": 1, "tp_size": 4},
            "decode": {"dp_size": 1, "tp_size": 4},
        },
    }
    assert_ucm_connector(ucm, p0)
    assert "use_layerwise: true" in next(f for f in p0.files if "ucm_config" in f.path).content
    dec = kv_config(d0)
    assert dec == {**mooncake, "kv_role": "kv_consumer"}
    # The guide gives the second instance kv_port 20002, but with TP4 the first instance's
    # ranks bind 20001..20004 (vllm-ascend 0.23: kv_port + dp rank * tp + tp rank); ucmctl
    # follows the EP guide's rule kv_port + i * tp instead.
    assert kv_config(d1)["kv_port"] == 20005
    assert kv_config(p1)["kv_connector_extra_config"]["connectors"][0]["kv_port"] == 20005
    proxy = plan.process("proxy")
    assert flags(proxy.argv)["port"] == "7850" and flags(proxy.argv)["p2p"] == "ascend"
    assert "--bootstrap" not in proxy.argv  # vllm-ascend's prefiller returns the decode params
    assert _proxy_targets(proxy) == (
        ["192.168.10.1:9000", "192.168.10.1:9001"],
        ["192.168.10.2:9000", "192.168.10.2:9001"],
    )


def assert_command_plain(process: Process, guide: str) -> None:
    expected = shlex.split(guide)
    ours, theirs = flags(process.argv), flags(expected)
    assert process.argv[0].endswith(expected[0])
    assert {k: ours[k] for k in theirs} == theirs
    assert ours["metrics-port"] == "9003"  # ucmctl's health gate reads the metrics port
    # mooncake_master listens on 0.0.0.0 unless told: ucmctl gives it the node's address
    node_address = urlsplit(str(process.url)).hostname
    assert (ours["rpc-address"], ours["metrics-host"]) == (node_address, node_address)


def test_pd_mixed(plans: dict[str, Plan]) -> None:
    plan = plans["pd-mixed"]
    assert [p.name for p in plan.processes] == ["mixed-0"]
    server = plan.process("mixed-0")
    assert_command(server, MIXED)
    assert server.env["ASCEND_RT_VISIBLE_DEVICES"] == "0,1,2,3,4,5,6,7"
    assert_ucm_connector(kv_config(server), server)


def test_1p1d_on_one_node(plans: dict[str, Plan]) -> None:
    plan = plans["1p1d"]
    p0, d0 = plan.process("prefill-0"), plan.process("decode-0")
    assert_command(p0, ONE_P_ONE_D)
    assert_command(d0, ONE_P_ONE_D, port="7801")
    assert p0.node == d0.node == "node1"
    # "the two commands differ in port and visible devices"
    assert (p0.env["CUDA_VISIBLE_DEVICES"], d0.env["CUDA_VISIBLE_DEVICES"]) == ("0", "1")
    assert "cache_buffer_capacity_gb: 32" in next(f for f in p0.files if "ucm_config" in f.path).content
    assert flags(plan.process("proxy").argv)["port"] == "7802"


def test_ep_layout_matches_run_multi_dp(plans: dict[str, Plan]) -> None:
    """The guide's run_multi_dp.sh, node by node: dp_rank_start, ports, cards, kv_ports."""
    plan = plans["ep-dp4tp8-dp8tp4"]
    servers = [p for p in plan.processes if p.role in ("prefill", "decode")]
    assert len([p for p in servers if p.role == "prefill"]) == 4
    assert len([p for p in servers if p.role == "decode"]) == 8
    # (role, host, port, dp_rank, cards, kv_port) as the guide's scripts compute them
    expected = [("prefill", f"192.168.10.{n}", 9000, n - 1, "0,1,2,3,4,5,6,7", 20001) for n in (1, 2, 3, 4)]
    for node, start in ((5, 0), (6, 2), (7, 4), (8, 6)):
        expected.append(("decode", f"192.168.10.{node}", 9000, start, "0,1,2,3", 20001))
        expected.append(("decode", f"192.168.10.{node}", 9001, start + 1, "4,5,6,7", 20005))
    seen = []
    for p in servers:
        f = flags(p.argv)
        kv = kv_config(p)
        mooncake = kv["kv_connector_extra_config"]["connectors"][0] if p.role == "prefill" else kv
        seen.append((p.role, plan.nodes[p.node].host, int(str(f["port"])), int(str(f["data-parallel-rank"])),
                     p.env["ASCEND_RT_VISIBLE_DEVICES"], mooncake["kv_port"]))  # fmt: skip
        tp = 8 if p.role == "prefill" else 4
        assert_command(p, EP_PREFILL if p.role == "prefill" else EP_DECODE, port=f["port"])
        assert f["data-parallel-size"] == ("4" if p.role == "prefill" else "8")
        assert f["data-parallel-address"] == ("192.168.10.1" if p.role == "prefill" else "192.168.10.5")
        assert f["data-parallel-rpc-port"] == "13395"
        assert f["tensor-parallel-size"] == str(tp)
        assert mooncake["kv_connector_extra_config"] == {
            "prefill": {"dp_size": 4, "tp_size": 8},
            "decode": {"dp_size": 8, "tp_size": 4},  # the decode side's, never the prefill's
        }
        env = p.env
        assert env["PYTHONHASHSEED"] == "0"
        assert env["HCCL_IF_IP"] == plan.nodes[p.node].host
        for var in ("GLOO_SOCKET_IFNAME", "TP_SOCKET_IFNAME", "HCCL_SOCKET_IFNAME"):
            assert env[var] == "eth0"
        assert (env["OMP_PROC_BIND"], env["OMP_NUM_THREADS"], env["HCCL_BUFFSIZE"]) == ("false", "10", "256")
        assert env["PYTORCH_NPU_ALLOC_CONF"] == "expandable_segments:True"
        assert env["TASK_QUEUE_ENABLE"] == "1" and env["VLLM_USE_MODELSCOPE"] == "True"
    assert seen == expected
    proxy = plan.process("proxy")
    assert flags(proxy.argv)["port"] == "7850"
    assert _proxy_targets(proxy) == (
        [f"192.168.10.{n}:9000" for n in (1, 2, 3, 4)],
        [f"192.168.10.{n}:{port}" for n in (5, 6, 7, 8) for port in (9000, 9001)],
    )
    master = plan.process("mooncake-master")
    assert master.node == "n1"
    assert_command_plain(master, MOONCAKE_MASTER)


def test_heterogeneous_sides_use_their_platforms_device_variable(plans: dict[str, Plan]) -> None:
    plan = plans["hetero-ascend-cuda"]
    p0, d0 = plan.process("prefill-0"), plan.process("decode-0")
    assert p0.env["ASCEND_RT_VISIBLE_DEVICES"] == "0" and "CUDA_VISIBLE_DEVICES" not in p0.env
    assert d0.env["CUDA_VISIBLE_DEVICES"] == "0" and "ASCEND_RT_VISIBLE_DEVICES" not in d0.env
    assert flags(p0.argv)["dtype"] == flags(d0.argv)["dtype"] == "bfloat16"
    assert kv_config(p0) == kv_config(d0) | {
        "kv_connector_extra_config": kv_config(p0)["kv_connector_extra_config"]
    }


def test_start_order(plans: dict[str, Plan]) -> None:
    for plan in plans.values():
        stages = [[p.role for p in stage] for stage in plan.stages()]
        flat = [r for stage in stages for r in stage]
        if "mooncake" in flat:
            assert stages[0] == ["mooncake"]
        if "proxy" in flat:
            assert stages[-1] == ["proxy"]
            servers = {p.name for p in plan.processes if p.role in ("prefill", "decode", "mixed")}
            assert set(plan.process("proxy").depends_on) == servers
