"""Topology -> Plan: a pure function (no I/O besides reading the packaged templates)."""

from __future__ import annotations

import posixpath
from typing import Any

from ucmctl.core import routing_names
from ucmctl.core.endpoints import tcp_url
from ucmctl.core.platforms import DEVICE_VARIABLE, NIC_VARIABLES, Platform
from ucmctl.core.ucm_config import CONNECTOR_NAMES, ConnectorEntry, StoreConfig, UcmConfig
from ucmctl.engines import KvTransfer, MooncakeLeg, ServerSpec, engine_for
from ucmctl.engines.mooncake import ASCEND_MOONCAKE, MooncakeConnectorFacts, connector_for, protocol_for
from ucmctl.plan.model import (
    UCM_CONFIG_FILE,
    NodePlan,
    Plan,
    Process,
    SlurmPlan,
    SshClusterPlan,
    Stage,
    StorePlan,
)
from ucmctl.plan.processes import (
    bind_address,
    place_process,
    python_of,
    reach_address,
    side_uses_store,
    store_backends,
    tool_path,
)
from ucmctl.plan.proxy_spec import ProxySpec, Upstream
from ucmctl.plan.render import render
from ucmctl.topology.container import Container
from ucmctl.topology.layout import Server, is_external_dp, servers
from ucmctl.topology.model import Mode, Node, Side, SlurmCluster, Storage, Topology, Transport


def build_plan(t: Topology, slurm_nodes: dict[str, tuple[str, str]] | None = None) -> Plan:
    """Every process of the deployment, its files, ports, health checks and start order.

    `slurm_nodes` binds a topology whose nodes Slurm chooses: node name -> (Slurm's node, its
    address). Without it such a topology plans with each node's name for its address: a plan
    to ask Slurm with, whose processes never start."""
    bound = slurm_nodes or {}
    t = _bound(t, bound)
    nodes = {
        name: _node_plan(t, name, node, bound[name][0] if name in bound else None)
        for name, node in t.nodes.items()
    }
    processes: list[Process] = []
    master: Process | None = None
    if t.mode is Mode.p2p and t.mooncake is not None:
        master = _mooncake_master(t, nodes)
        processes.append(master)
    placed = servers(t)
    for server in placed:
        processes.append(_server(t, nodes, server, [master.name] if master else []))
    if t.proxy is not None:
        upstream = [p for p in processes if p.is_server]
        processes += [_proxy(t, nodes, upstream, *place) for place in t.proxy.places()]
    return Plan(
        deployment=t.name,
        mode=t.mode.value,
        engine=t.engine.value,
        topology_digest=t.digest(),
        nodes=nodes,
        processes=processes,
        store=_store(t, processes),
        cluster=_cluster(t),
    )


def _cluster(t: Topology) -> SshClusterPlan | SlurmPlan:
    if not isinstance(t.cluster, SlurmCluster):
        return SshClusterPlan()
    c = t.cluster
    return SlurmPlan(
        partition=c.partition,
        account=c.account,
        qos=c.qos,
        time_limit=c.time_limit,
        wait_allocation=c.wait_allocation,
        choose_nodes=c.choose_nodes,
        gres=c.gres,
    )


def _bound(t: Topology, bound: dict[str, tuple[str, str]]) -> Topology:
    """The topology with an address for every node Slurm chose (its own name until bound)."""
    if all(node.host for node in t.nodes.values()):
        return t
    nodes = {
        name: node if node.host else node.model_copy(update={"host": bound.get(name, (name, name))[1]})
        for name, node in t.nodes.items()
    }
    return t.model_copy(update={"nodes": nodes})


def _store(t: Topology, processes: list[Process]) -> StorePlan | None:
    if t.storage is None:
        return None
    return StorePlan(
        pipeline=t.storage.store_pipeline,
        backends=store_backends(t.storage),
        cache_buffer_capacity_gb=t.storage.cache_buffer_capacity_gb,
        io_direct=t.storage.io_direct,
        pack_blocks=t.storage.pack_blocks,
        users=[p.name for p in processes if p.is_server and side_uses_store(t, p.role)],
    )


def _node_plan(t: Topology, name: str, node: Node, slurm_node: str | None) -> NodePlan:
    workdir = node.workdir or f"/tmp/ucmctl-{node.user}"
    return NodePlan(
        name=name,
        host=node.host,
        transport="slurm" if isinstance(t.cluster, SlurmCluster) else node.transport.value,
        user=node.user,
        ssh_port=node.port,
        key=node.key,
        platform=node.platform.value,
        devices=node.devices,
        python=python_of(node),
        run_dir=posixpath.join(workdir, t.name),
        bind=bind_address(node),
        slurm_node=slurm_node,
        systemd=node.systemd,
    )


def _mooncake_master(t: Topology, nodes: dict[str, NodePlan]) -> Process:
    mc = t.mooncake
    assert mc is not None
    node = t.nodes[mc.master_node]
    container = t.container_of(mc.master_node)
    argv = [
        tool_path(node, "mooncake_master", container),
        "--port", str(mc.port),
        "--eviction_high_watermark_ratio", str(mc.eviction_high_watermark_ratio),
        "--eviction_ratio", str(mc.eviction_ratio),
        "--default_kv_lease_ttl", str(mc.default_kv_lease_ttl),
        # Both listeners default to 0.0.0.0 in mooncake_master; its HTTP metadata server (also
        # 0.0.0.0) stays off: P2PHANDSHAKE needs none.
        "--rpc_address", bind_address(node),
        "--metrics_host", bind_address(node),
        "--metrics_port", str(mc.metrics_port),
    ]  # fmt: skip
    base = f"http://{reach_address(node)}:{mc.metrics_port}"
    return place_process(
        t,
        nodes,
        name="mooncake-master",
        role="mooncake",
        node=mc.master_node,
        stage=Stage.mooncake,
        argv=argv,
        env=dict(node.env),
        extra_files={},
        container=container,
        ports={"master": mc.port, "metrics": mc.metrics_port},
        url=base,
        health=[f"{base}/metrics"],
    )


def _side(t: Topology, name: str) -> Side:
    side = getattr(t, name)
    assert side is not None
    return side


def _server(t: Topology, nodes: dict[str, NodePlan], s: Server, deps: list[str]) -> Process:
    side = _side(t, s.side)
    node = t.nodes[s.node]
    container = t.container_of(s.node, s.side)
    work = posixpath.join(nodes[s.node].run_dir, s.name)
    files: dict[str, str] = {}
    env: dict[str, str] = {"PYTHONHASHSEED": str(t.model.hash_seed)}
    device_variable = DEVICE_VARIABLE[node.platform]
    if device_variable:
        env[device_variable] = ",".join(str(d) for d in s.devices)
    env.update(_platform_env(node))
    engine = engine_for(t.engine.value)
    env.update(engine.platform_env(node.platform.value, nodes[s.node].run_dir))

    ucm_config = None
    if t.storage is not None and side_uses_store(t, s.side):
        ucm_config = posixpath.join(work, UCM_CONFIG_FILE)
        # Centralized PD: prefill answers only once decode can find the blocks on disk.
        ucm = _ucm_config(t.storage, wait_persisted=t.mode is Mode.centralized and s.side == "prefill")
        files[UCM_CONFIG_FILE] = render("ucm_config.yaml.j2", deployment=t.name, ucm=ucm)
    if t.mode is Mode.p2p and _mooncake_facts(t, node).reads_mooncake_json:
        files["mooncake.json"] = _mooncake_json(t)
        env["MOONCAKE_CONFIG_PATH"] = posixpath.join(work, "mooncake.json")
    if s.bootstrap_port:
        env[engine.bootstrap_port_variable] = str(s.bootstrap_port)
    announces = t.mode is Mode.p2p and not _mooncake_facts(t, node).reads_mooncake_json
    if announces and (node.transport is Transport.local or _is_ip(node.host)):
        # the address vLLM's Mooncake transfer engine and side channel announce to peers (both
        # sides: prefill pushes to the address decode announces)
        env[engine.host_ip_variable] = reach_address(node)
    env.update(node.env)
    env.update(side.env)
    cache_dirs: list[str] = []
    if container.detached and engine.cache_root_variable:
        # A container's own files go with it: the engine's caches (a model's inspection, compiled
        # graphs) stay on the node, as a bare server's do, or every start pays for them again.
        default = posixpath.join(nodes[s.node].run_dir, "vllm-cache")
        cache_dirs.append(env.setdefault(engine.cache_root_variable, default))

    spec = _server_spec(t, s, node, container, ucm_config)
    argv = engine.argv(spec)

    base = f"http://{reach_address(node)}:{s.port}"
    ports = _server_ports(s)
    return place_process(
        t,
        nodes,
        name=s.name,
        role=s.side,
        node=s.node,
        stage=Stage.servers,
        argv=argv,
        env=env,
        extra_files=files,
        container=container,
        cache_dirs=cache_dirs,
        restart=side.restart,
        ports=ports,
        url=base,
        health=[f"{base}/health", f"{base}/v1/models"],
        depends_on=deps,
        devices=list(s.devices),
        device_variable=device_variable,
        dp_rank=s.dp_rank,
        server=spec,
    )


def _server_spec(
    t: Topology, s: Server, node: Node, container: Container, ucm_config: str | None
) -> ServerSpec:
    """What the engine is told to serve for the server `s`: its model, listener, parallelism and
    KV connectors."""
    side = _side(t, s.side)
    engine = engine_for(t.engine.value)
    dtype = side.dtype or t.model.dtype
    external = is_external_dp(side)  # one API server per DP rank: each is told its rank
    return ServerSpec(
        executable=engine.executable(
            python_of(node, container), lambda name: tool_path(node, name, container)
        ),
        model=t.model.path,
        host=bind_address(node),
        port=s.port,
        served_model_name=t.model.served_name,
        dtype=None if dtype == "auto" else dtype,
        data_parallel_size=s.dp_size,
        data_parallel_rank=s.dp_rank if external else None,
        data_parallel_address=str(s.dp_address) if external else None,
        data_parallel_rpc_port=s.dp_rpc_port if external else None,
        tensor_parallel_size=s.tp_size,
        enable_expert_parallel=side.expert_parallel,
        flags=dict(side.flags),
        kv_transfer_config=engine.kv_transfer_config(_kv_transfer(t, s, ucm_config)),
        kv_events_config=_kv_events_config(s),
    )


def _kv_events_config(s: Server) -> dict[str, Any] | None:
    """vLLM's --kv-events-config where the proxy reads the server's events: ZMQ, the engine
    binding every address on its port (it adds its DP rank to the port given)."""
    if s.kv_events_port is None:
        return None
    base = s.kv_events_port - (s.dp_rank or 0)
    return {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": f"tcp://*:{base}"}


def _server_ports(s: Server) -> dict[str, int]:
    """The ports the server `s` listens on, by what they serve."""
    ports = {"http": s.port}
    if s.kv_port:
        ports["kv"] = s.kv_port
    if s.bootstrap_port:
        ports["bootstrap"] = s.bootstrap_port
    if s.kv_events_port:
        ports["kv_events"] = s.kv_events_port
    if s.dp_rank == 0 and s.dp_rpc_port:
        ports["dp_rpc"] = s.dp_rpc_port
    return ports


def _ucm_config(storage: Storage, *, wait_persisted: bool) -> UcmConfig:
    """The UCM config file's values, through its one schema (the checks ran it already)."""
    store = StoreConfig.model_validate(storage.ucm_store_values())
    return UcmConfig(
        ucm_connectors=[ConnectorEntry(ucm_connector_name=CONNECTOR_NAMES[0], ucm_connector_config=store)],
        enable_event_sync=storage.enable_event_sync,
        use_layerwise=storage.use_layerwise,
        wait_persisted=wait_persisted,
        load_timeout_s=storage.load_timeout_s,
        dump_timeout_s=storage.dump_timeout_s,
        pack_blocks=storage.pack_blocks,
    )


def _platform_env(node: Node) -> dict[str, str]:
    """What the guides export for a platform, derived from the node's facts (the engine's own
    variables come from the engine)."""
    env: dict[str, str] = {}
    if node.platform is Platform.ascend and _is_ip(node.host):
        env["HCCL_IF_IP"] = node.host
    if node.nic:
        for var in NIC_VARIABLES[node.platform]:
            env[var] = node.nic
    return env


def _is_ip(host: str) -> bool:
    parts = host.split(".")
    return len(parts) == 4 and all(p.isdigit() and int(p) < 256 for p in parts)


def _kv_transfer(t: Topology, s: Server, ucm_config: str | None) -> KvTransfer:
    """The KV connectors a server loads: the store's (its UCM config), and Mooncake's in P2P."""
    if t.mode is not Mode.p2p:
        return KvTransfer(ucm_config=ucm_config)
    mc = t.mooncake
    assert mc is not None
    node = t.nodes[s.node]
    facts = _mooncake_facts(t, node)
    parallel: dict[str, dict[str, int]] = {}
    if facts.reads_mooncake_json:  # vllm-ascend's MooncakeConnectorV1: the guides' keys
        prefill, decode = _side(t, "prefill"), _side(t, "decode")
        parallel = {
            "prefill": {"dp_size": prefill.dp, "tp_size": prefill.tp},
            "decode": {"dp_size": decode.dp, "tp_size": decode.tp},
        }
        peer = (prefill if s.side == "decode" else decode).kv_peer
        if peer is not None:  # checks guarantee it equals the other side; written as the user wrote it
            other = "decode" if s.side == "prefill" else "prefill"
            parallel[other] = {"dp_size": peer.dp, "tp_size": peer.tp}
    leg = MooncakeLeg(
        connector=facts.name,
        role="kv_producer" if s.side == "prefill" else "kv_consumer",
        guides_keys=facts.reads_mooncake_json,
        kv_port=s.kv_port,
        parallel=parallel,
        protocol=protocol_for(node.platform, facts, mc.protocol),
        device_name=mc.device_name,
        num_workers=mc.num_workers,
    )
    # Prefill stores what it computes too (MultiConnector); decode gets its KV from prefill.
    return KvTransfer(ucm_config=ucm_config if s.side == "prefill" else None, mooncake=leg)


def _mooncake_facts(t: Topology, node: Node) -> MooncakeConnectorFacts:
    assert t.mooncake is not None
    facts = connector_for(node.platform, t.mooncake.connector)
    assert facts is not None, "checks refuse a P2P node without a known connector"
    return facts


def _mooncake_json(t: Topology) -> str:
    mc = t.mooncake
    assert mc is not None
    master = t.nodes[mc.master_node]
    return render(
        "mooncake.json.j2",
        metadata_server="P2PHANDSHAKE",
        protocol=protocol_for(master.platform, ASCEND_MOONCAKE, mc.protocol),
        device_name=mc.device_name,
        master_server_address=f"{master.host}:{mc.port}",
        global_segment_size=mc.global_segment_size,
    )


def _proxy(
    t: Topology, nodes: dict[str, NodePlan], upstream: list[Process], name: str, node_name: str, port: int
) -> Process:
    """The proxy, or one of its replicas (`name` on `node_name`, at `port`): each one whole."""
    proxy = t.proxy
    assert proxy is not None
    node = t.nodes[node_name]
    container = t.container_of(node_name)
    # the router protocol (P2P): the connector's, as the first server's node runs it
    router = _mooncake_facts(t, t.nodes[upstream[0].node]).router if t.mode is Mode.p2p else None
    spec = ProxySpec(
        python=python_of(node, container),
        host=proxy.host or bind_address(node),
        port=port,
        mode="mixed" if t.mode is Mode.mixed else "pd",
        p2p=router,
        routing=str(routing_names.canonical(proxy.routing.value)),
        upstreams=tuple(_upstream(t, p, router) for p in upstream),
        block_size=_block_size(upstream),
        direct_below=proxy.direct_below,
        roles=proxy.roles,
        served_model=t.model.served_name or t.model.path,
        migrations=proxy.migrations,
        stall_timeout=proxy.stall_timeout,
    )
    argv = spec.argv()
    base = f"http://{reach_address(node)}:{port}"
    return place_process(
        t,
        nodes,
        name=name,
        role="proxy",
        node=node_name,
        stage=Stage.proxy,
        argv=argv,
        env=dict(node.env),
        extra_files={},
        container=container,
        restart=proxy.restart,
        ports={"http": port},
        url=base,
        health=[f"{base}/health"],
        depends_on=[p.name for p in upstream],
        proxy=spec,
    )


def _block_size(servers: list[Process]) -> int | None:
    """The servers' KV block size where the topology gives it (`flags: {block-size: N}`)."""
    sizes = {p.server.flags.get("block-size") for p in servers if p.server is not None}
    size = sizes.pop() if len(sizes) == 1 else None
    return size if isinstance(size, int) and not isinstance(size, bool) else None


def _upstream(t: Topology, p: Process, router: str | None) -> Upstream:
    """A server as the proxy reaches it; with the mooncake router, a prefiller's bootstrap
    server (the proxy asks it for the prefiller's engine); where the proxy reads KV-cache
    events, the server's publisher."""
    assert p.url is not None
    events = None
    if "kv_events" in p.ports:
        events = tcp_url(reach_address(t.nodes[p.node]), p.ports["kv_events"])
    if t.mode is Mode.mixed:
        return Upstream(url=str(p.url), role="mixed", kv_events=events)
    if p.role != "prefill":
        return Upstream(url=str(p.url), role="decode", kv_events=events)
    bootstrap = None
    if router == "mooncake":
        bootstrap = f"http://{reach_address(t.nodes[p.node])}:{p.ports['bootstrap']}"
    return Upstream(url=str(p.url), role="prefill", bootstrap=bootstrap, kv_events=events)
