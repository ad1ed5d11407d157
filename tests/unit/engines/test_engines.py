"""The engine seam: every server's command line is its engine's argv of the Plan's spec, and the
registry covers what the topology can name."""

from __future__ import annotations

import json
import typing
from pathlib import Path

import pytest

from ucmctl.engines import DEFAULT_ENGINE, ENGINES, KvTransfer, MooncakeLeg, ServerSpec, engine_for
from ucmctl.plan.build import build_plan
from ucmctl.plan.model import Plan
from ucmctl.topology.load import load_topology
from ucmctl.topology.model import Engine as EngineName
from ucmctl.topology.model import Topology

EXAMPLES = sorted((Path(__file__).resolve().parents[3] / "topologies").glob("*.yaml"))


def test_the_topology_and_the_plan_name_the_registrys_engines_in_its_order() -> None:
    assert list(ENGINES) == ["vllm", "sim"]
    assert [e.value for e in EngineName] == list(ENGINES)
    assert typing.get_args(Plan.model_fields["engine"].annotation) == tuple(ENGINES)
    assert Topology.model_fields["engine"].default == EngineName(DEFAULT_ENGINE) == EngineName.vllm
    for name, engine in ENGINES.items():
        assert engine.name == name


def test_every_engine_exposes_the_series_bench_reads() -> None:
    # bench/capacity.py reads the default engine's names: an engine with its own would need them
    # passed through, as bench/hitrate.py and bench/series.py take them.
    assert len({engine.metrics for engine in ENGINES.values()}) == 1


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_each_servers_argv_is_its_engines_argv_of_its_spec(path: Path) -> None:
    plan = build_plan(load_topology(path))
    engine = engine_for(plan.engine)
    servers = plan.servers()
    assert servers
    for p in servers:
        assert p.server is not None
        assert engine.argv(p.server) == p.argv
        assert p.server.external_dp == (p.dp_rank is not None and "--data-parallel-rank" in p.argv)
    for p in plan.processes:
        assert (p.server is not None) == p.is_server


def spec(**kw: object) -> ServerSpec:
    return ServerSpec(executable=["vllm", "serve"], model="/m", host="10.0.0.1", port=8000, **kw)  # type: ignore[arg-type]


def test_vllm_argv_in_the_order_vllm_serve_is_written() -> None:
    vllm = engine_for("vllm")
    assert vllm.argv(spec()) == ["vllm", "serve", "/m", "--host", "10.0.0.1", "--port", "8000",
                                 "--data-parallel-size", "1", "--tensor-parallel-size", "1"]  # fmt: skip
    full = spec(served_model_name="q", dtype="float32", data_parallel_size=8, data_parallel_rank=3,
                data_parallel_address="10.0.0.9", data_parallel_rpc_port=13345, tensor_parallel_size=4,
                enable_expert_parallel=True, flags={"max-model-len": 20000, "enforce-eager": True,
                                                    "enable-prefix-caching": False, "x": {"a": [1]}},
                kv_transfer_config={"kv_connector": "UCMConnector"})  # fmt: skip
    assert vllm.argv(full)[2:] == [
        "/m", "--host", "10.0.0.1", "--port", "8000", "--served-model-name", "q", "--dtype", "float32",
        "--data-parallel-size", "8", "--data-parallel-rank", "3", "--data-parallel-address", "10.0.0.9",
        "--data-parallel-rpc-port", "13345", "--tensor-parallel-size", "4", "--enable-expert-parallel",
        "--max-model-len", "20000", "--enforce-eager", "--no-enable-prefix-caching", "--x", '{"a":[1]}',
        "--kv-transfer-config", '{"kv_connector": "UCMConnector"}',
    ]  # fmt: skip


def test_the_simulator_is_vllms_command_line_with_another_executable() -> None:
    sim, vllm = engine_for("sim"), engine_for("vllm")

    def tool(name: str) -> str:
        return f"/v/bin/{name}"

    assert sim.executable("/v/bin/python", tool) == ["/v/bin/python", "-m", "ucmctl", "sim", "serve"]
    assert vllm.executable("/v/bin/python", tool) == ["/v/bin/vllm", "serve"]
    assert sim.argv(spec(tensor_parallel_size=2)) == vllm.argv(spec(tensor_parallel_size=2))
    assert (sim.health_timeout, vllm.health_timeout) == (60.0, 900.0)
    assert sim.cpu_binding_variable is None and vllm.cpu_binding_variable == "VLLM_CPU_OMP_THREADS_BIND"


def test_kv_transfer_configs() -> None:
    vllm = engine_for("vllm")
    assert vllm.kv_transfer_config(KvTransfer()) is None
    ucm = vllm.kv_transfer_config(KvTransfer(ucm_config="/r/ucm_config.yaml"))
    assert ucm is not None and ucm["kv_connector"] == "UCMConnector"
    assert ucm["kv_connector_extra_config"] == {"UCM_CONFIG_FILE": "/r/ucm_config.yaml"}
    leg = MooncakeLeg(connector="MooncakeConnector", role="kv_consumer", guides_keys=False, protocol="tcp")
    alone = vllm.kv_transfer_config(KvTransfer(mooncake=leg))
    assert alone == {"kv_connector": "MooncakeConnector", "kv_role": "kv_consumer",
                     "kv_connector_extra_config": {"mooncake_protocol": "tcp"}}  # fmt: skip
    producer = leg.model_copy(update={"role": "kv_producer"})
    both = vllm.kv_transfer_config(KvTransfer(ucm_config="/u.yaml", mooncake=producer))
    assert both is not None and both["kv_connector"] == "MultiConnector"
    first, second = both["kv_connector_extra_config"]["connectors"]
    assert first["kv_connector_module_path"] == "ucm_connector.mooncake"  # its transfer metrics
    assert second == ucm | {"kv_connector_extra_config": {"UCM_CONFIG_FILE": "/u.yaml"}}
    sides = {"prefill": {"dp_size": 2, "tp_size": 8}, "decode": {"dp_size": 4, "tp_size": 4}}
    ascend = MooncakeLeg(connector="MooncakeConnectorV1", role="kv_producer", guides_keys=True, kv_port=30000,
                         parallel=sides)  # fmt: skip
    assert json.dumps(vllm.kv_transfer_config(KvTransfer(mooncake=ascend))) == json.dumps({
        "kv_connector": "MooncakeConnectorV1", "kv_role": "kv_producer", "kv_port": 30000,
        "kv_connector_extra_config": sides,
    })  # fmt: skip
