"""Where every API server of a topology goes: node, ports, devices and DP rank.

The rules are the guides' (see the EP scripts): server i on a node listens on `port + i`, its
Mooncake kv_port is `kv_port + i * tp`, its cards are the next `tp` (internal DP: `dp * tp`)
consecutive cards of the node, and with external DP load balancing the ranks are numbered node
by node, the DP master address being the host of the group's first node.
"""

from __future__ import annotations

from dataclasses import dataclass

from ucmctl.topology.model import DpMode, Mode, Platform, Side, Topology


@dataclass(frozen=True)
class Server:
    side: str  # prefill | decode | mixed
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
    kv_port: int | None  # Mooncake kv_port (p2p only); the server uses kv_port .. kv_port + tp - 1

    @property
    def name(self) -> str:
        return f"{self.side}-{self.index}"

    @property
    def kv_ports(self) -> range:
        return range(self.kv_port, self.kv_port + self.tp_size) if self.kv_port else range(0)


def devices_per_server(side: Side) -> int:
    return side.dp * side.tp if side.dp_mode is DpMode.internal else side.tp


def is_external_dp(side: Side) -> bool:
    return side.dp > 1 and side.dp_mode is DpMode.external


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
            kv_port = side.kv_port + local * side.tp if topology.mode is Mode.p2p else None
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
                )
            )
    return out
