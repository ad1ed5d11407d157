"""Where every API server of a topology goes: node, ports, devices and DP rank.

The rules are the guides' (see the EP scripts): server i on a node listens on `port + i`, its
Mooncake kv_port is `kv_port + i * tp`, its cards are the next `tp` (internal DP: `dp * tp`)
consecutive cards of the node, and with external DP load balancing the ranks are numbered node
by node, the DP master address being the host of the group's first node.
"""

from __future__ import annotations

from dataclasses import dataclass

from ucmctl.core import routing_names
from ucmctl.core.names import ServerRole
from ucmctl.core.platforms import Platform
from ucmctl.engines.mooncake import connector_for
from ucmctl.topology.model import DpMode, Mode, Side, Topology


@dataclass(frozen=True)
class Server:
    side: ServerRole
    index: int  # position within the side, node by node
    node: str
    local_index: int  # position on its node
    port: int
    devices: tuple[int, ...]  # empty on the CPU platform
    dp_size: int
    tp_size: int
    dp_rank: int | None  # set for external DP (one API server per rank)
    dp_address: str | None
    dp_rpc_port: int | None
    kv_port: int | None  # Mooncake kv_port (MooncakeConnectorV1); the server uses kv_port .. + tp - 1
    bootstrap_port: int | None = None  # MooncakeConnector bootstrap server (p2p prefill)
    # the port its KV-cache events are published on (the engine binds its endpoint's port plus
    # its DP rank), where the proxy reads them
    kv_events_port: int | None = None

    @property
    def name(self) -> str:
        return f"{self.side}-{self.index}"

    @property
    def kv_ports(self) -> range:
        """The ports MooncakeConnectorV1 binds on a prefill server: its kv_port plus the global
        DP rank times tp (vllm-ascend 0.23 adds that itself), then one per TP rank."""
        if not self.kv_port or self.side != "prefill":
            return range(0)  # a consumer connects, it binds nothing
        base = self.kv_port + (self.dp_rank or 0) * self.tp_size
        return range(base, base + self.tp_size)


def devices_per_server(side: Side) -> int:
    return side.dp * side.tp if side.dp_mode is DpMode.internal else side.tp


def is_external_dp(side: Side) -> bool:
    return side.dp > 1 and side.dp_mode is DpMode.external


EVENTS_PORT_OFFSET = 1000  # a server's KV-cache events, by default: its API port + this


def reads_kv_events(topology: Topology) -> bool:
    """Whether the proxy reads the servers' KV-cache events: its index is read (routing kv, or
    direct decodes) and the topology leaves them on."""
    proxy = topology.proxy
    if proxy is None or not proxy.kv_events:
        return False
    return routing_names.canonical(proxy.routing.value) == "kv" or proxy.direct_below > 0


def servers(topology: Topology) -> list[Server]:
    """Every API server, prefill first, then decode (or the mixed side)."""
    next_card: dict[str, int] = {}
    out: list[Server] = []
    for side_name, side in topology.sides():
        per_server = devices_per_server(side)
        slots = [(node, local) for node, count in side.placement() for local in range(count)]
        for index, (node_name, local) in enumerate(slots):
            node = topology.nodes[node_name]
            devices: tuple[int, ...] = ()
            if node.platform is not Platform.cpu:
                first = next_card.get(node_name, 0)
                devices = tuple(range(first, first + per_server))
                next_card[node_name] = first + per_server
            rank = address = rpc = None
            if is_external_dp(side):
                rank = index % side.dp
                address = topology.nodes[slots[index - rank][0]].host
                rpc = side.dp_rpc_port
            kv_port = bootstrap = None
            if topology.mode is Mode.p2p and topology.mooncake is not None:
                facts = connector_for(node.platform, topology.mooncake.connector)
                if facts is not None and facts.reads_mooncake_json:
                    kv_port = side.kv_port + local * side.tp
                if facts is not None and facts.bootstrap_port and side_name == "prefill":
                    bootstrap = side.bootstrap_port + local
            events = None  # one engine per server only: the proxy reads one stream per instance
            if reads_kv_events(topology) and not (side.dp > 1 and side.dp_mode is DpMode.internal):
                base = side.kv_events_port or side.port + EVENTS_PORT_OFFSET
                events = base + local + (rank or 0)
            out.append(
                Server(
                    side=side_name,
                    index=index,
                    node=node_name,
                    local_index=local,
                    port=side.port + local,
                    devices=devices,
                    dp_size=side.dp,
                    tp_size=side.tp,
                    dp_rank=rank,
                    dp_address=address,
                    dp_rpc_port=rpc,
                    kv_port=kv_port,
                    bootstrap_port=bootstrap,
                    kv_events_port=events,
                )
            )
    return out
