"""The pitfalls of the servers as placed on the nodes: more devices than a node has, vLLM CPU
servers that bind the same cores, and two processes on one port."""

from __future__ import annotations

from collections import defaultdict

from ucmctl.engines import engine_for
from ucmctl.topology.layout import devices_per_server, servers
from ucmctl.topology.model import Mode, Platform, Topology
from ucmctl.topology.source import KeyPath


def check_placement(t: Topology, bad) -> None:
    """Where the servers land: each node's devices, CPU cores and ports (check_topology calls this
    only when all else passed: placement needs valid node references)."""
    placed = servers(t)
    used: dict[str, int] = defaultdict(int)
    first_side: dict[str, str] = {}
    for server in placed:
        used[server.node] += len(server.devices)
        first_side.setdefault(server.node, server.side)
    for node_name, count in used.items():
        node = t.nodes[node_name]
        if count > node.devices:
            sides = [(n, s) for n, s in t.sides() if node_name in s.nodes]
            detail = " + ".join(
                f"{n} {dict(s.placement())[node_name]} x {devices_per_server(s)}" for n, s in sides
            )
            bad(
                ("nodes", node_name, "devices"),
                f"node {node_name!r} has {node.devices} devices but its servers need {count} ({detail})",
                "lower servers_per_node or tp, or spread the side over more nodes",
            )

    _check_cpu_binding(t, placed, bad)

    ports: dict[str, dict[int, str]] = defaultdict(dict)
    reported: set[tuple[str, str, str]] = set()

    def claim(node: str, port: int, owner: str, path: KeyPath) -> None:
        if port > 65535:
            bad(path, f"{owner} would listen on port {port}, above 65535", "lower the base port")
            return
        holder = ports[node].get(port)
        if holder is not None and holder != owner and (node, holder, owner) not in reported:
            reported.add((node, holder, owner))  # one line per pair, not per port of a range
            bad(
                path,
                f"port {port} on node {node!r} is used by both {holder} and {owner}",
                "give each process its own port (servers and proxy replicas on a node use port + i, "
                "Mooncake kv_port + i*tp .. + tp-1)",
            )
        ports[node].setdefault(port, owner)

    if t.mooncake is not None and t.mode is Mode.p2p:
        claim(t.mooncake.master_node, t.mooncake.port, "mooncake master", ("mooncake", "port"))
        claim(
            t.mooncake.master_node,
            t.mooncake.metrics_port,
            "mooncake metrics",
            ("mooncake", "metrics_port"),
        )
    for server in placed:
        claim(server.node, server.port, f"{server.name} API", (server.side, "port"))
        if server.dp_rank == 0 and server.dp_rpc_port:
            claim(
                server.node,
                server.dp_rpc_port,
                f"{server.name} DP rpc",
                (server.side, "dp_rpc_port"),
            )
        for p in server.kv_ports:
            claim(server.node, p, f"{server.name} Mooncake kv_port", (server.side, "kv_port"))
        for port, what, key in (
            (server.bootstrap_port, "Mooncake bootstrap", "bootstrap_port"),
            (server.kv_events_port, "KV-cache events", "kv_events_port"),
        ):
            if port:
                claim(server.node, port, f"{server.name} {what}", (server.side, key))
    if t.proxy is not None:
        for name, where, port in t.proxy.places():
            if where in t.nodes and port <= 65535:  # an unknown node or a port past the range: said before
                claim(where, port, name, ("proxy", "port"))


def _check_cpu_binding(t: Topology, placed: list, bad) -> None:
    """vLLM on the CPU binds its threads itself, and every server on a machine picks the same
    cores (on 2 cores: both core 0, each at half speed; a Mooncake receiver thread sharing them
    starves). Servers that share a CPU node must each be given their own cores."""
    variable = engine_for(t.engine.value).cpu_binding_variable
    if variable is None:  # the engine binds no cores (the simulator)
        return
    by_node: dict[str, list[tuple[str, str | None]]] = defaultdict(list)
    for server in placed:
        node = t.nodes[server.node]
        if node.platform is not Platform.cpu:
            continue
        side = dict(t.sides())[server.side]
        bind = {**node.env, **side.env}.get(variable)
        by_node[server.node].append((server.side, bind))
    for node_name, binds in by_node.items():
        if len(binds) < 2:
            continue
        values = [b for _, b in binds]
        # unset or "auto": vLLM's own choice, the same for every server; "nobind": the OS places
        culprit = next(
            (s for s, b in binds if b in (None, "auto") or (b != "nobind" and values.count(b) > 1)), None
        )
        if culprit is None:
            continue
        bad(
            (culprit, "env", variable),
            f"node {node_name!r} runs {len(binds)} vLLM CPU servers and vLLM binds each to the same "
            f"cores unless {variable} gives each its own",
            'set it per side, e.g. "0" and "1", or core ranges such as "0-15" and "16-31"',
        )


def check_proxy_places(t: Topology, bad) -> None:
    """The proxy's node, or the nodes of its replicas, and the ports they take."""
    proxy = t.proxy
    assert proxy is not None
    if (proxy.node is None) == (proxy.nodes is None):
        bad(
            ("proxy", "node"),
            "the proxy needs a node, or nodes to spread its replicas over: "
            + ("neither is given" if proxy.node is None else "both are given"),
            "give proxy: {node: <node>}, or proxy: {nodes: [<node>, ...], replicas: N}",
        )
        return
    key = "node" if proxy.node is not None else "nodes"
    named = [proxy.node] if proxy.node is not None else list(proxy.nodes or [])
    if not named:
        bad(("proxy", "nodes"), "is empty", "name the nodes the replicas run on, or give node")
        return
    for name in named:
        if name not in t.nodes:
            bad(("proxy", key), f"unknown node {name!r}", f"defined nodes: {', '.join(t.nodes)}")
    if len(set(named)) < len(named):
        bad(
            ("proxy", "nodes"),
            "names a node twice",
            "replicas on one node take consecutive ports: raise replicas",
        )
    last = max(port for _, _, port in proxy.places())
    if last > 65535:
        bad(
            ("proxy", "replicas"),
            f"{proxy.replicas} replicas from port {proxy.port} on {len(named)} node(s) need ports "
            f"up to {last}, past 65535",
            "lower replicas or port, or spread the replicas over more nodes",
        )
    if len(named) > 1 and proxy.host is not None and proxy.host not in ("0.0.0.0", "::"):
        bad(
            ("proxy", "host"),
            f"{proxy.host} is one node's address; the replicas run on {', '.join(named)}",
            "drop host (each listens on its node's bind address), or use 0.0.0.0",
        )
