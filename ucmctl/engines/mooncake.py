"""The Mooncake P2P connectors ucmctl can render, and what each one reads.

Two connectors move KV from prefill to decode through Mooncake, with different configuration
and different router protocols:

- vLLM's in-tree `MooncakeConnector` (CUDA, and the CPU build): reads `mooncake_protocol`,
  `device_name` and `num_workers` from `kv_connector_extra_config`, runs one bootstrap server
  per prefill API server on `VLLM_MOONCAKE_BOOTSTRAP_PORT`, and needs the router to send a
  `transfer_id` on both legs plus the prefiller's `remote_engine_id` and
  `remote_bootstrap_addr` on the decode leg. It reads neither mooncake.json nor kv_port.
- vllm-ascend's `MooncakeConnectorV1` (the guides' Ascend P2P; read in vllm-ascend 0.23.0):
  reads `kv_port` and the `prefill`/`decode` dp/tp sections; a producer binds
  `kv_port + global DP rank * tp + tp rank`. Its prefiller returns the decode leg's
  `kv_transfer_params` itself. It does not read `MOONCAKE_CONFIG_PATH`; ucmctl still writes the
  guides' mooncake.json next to it, which vllm-ascend's Mooncake store connector reads.
"""

from __future__ import annotations

from dataclasses import dataclass

from ucmctl.core.platforms import Platform


@dataclass(frozen=True)
class MooncakeConnectorFacts:
    name: str  # the kv_connector name vLLM knows it by
    protocols: tuple[str, ...]  # transfer protocols it can use, the default first
    router: str  # the proxy's --p2p protocol for it
    reads_mooncake_json: bool  # the guides' keys: kv_port, prefill/decode dp+tp, mooncake.json
    bootstrap_port: bool  # one bootstrap server per prefill API server


VLLM_MOONCAKE = MooncakeConnectorFacts(
    name="MooncakeConnector",
    protocols=("rdma", "tcp"),
    router="mooncake",
    reads_mooncake_json=False,
    bootstrap_port=True,
)
ASCEND_MOONCAKE = MooncakeConnectorFacts(
    name="MooncakeConnectorV1",
    protocols=("ascend",),
    router="ascend",
    reads_mooncake_json=True,
    bootstrap_port=False,
)
CONNECTORS = {c.name: c for c in (VLLM_MOONCAKE, ASCEND_MOONCAKE)}

# The connector each platform's vLLM ships for P2P; platforms absent here have none.
DEFAULT_CONNECTOR: dict[Platform, MooncakeConnectorFacts] = {
    Platform.cuda: VLLM_MOONCAKE,
    Platform.cpu: VLLM_MOONCAKE,
    Platform.ascend: ASCEND_MOONCAKE,
}

# Protocols a platform's hardware can carry, whatever the connector supports.
PLATFORM_PROTOCOLS: dict[Platform, tuple[str, ...]] = {
    Platform.cuda: ("rdma", "tcp"),
    Platform.cpu: ("tcp",),  # host memory, no RDMA NIC assumed
    Platform.ascend: ("ascend", "rdma", "tcp"),
}


def connector_for(platform: Platform, explicit: str | None) -> MooncakeConnectorFacts | None:
    """The connector a node of `platform` runs (the topology's choice first), or None if unknown."""
    if explicit is not None:
        return CONNECTORS.get(explicit)
    return DEFAULT_CONNECTOR.get(platform)


def protocol_for(platform: Platform, connector: MooncakeConnectorFacts, explicit: str | None) -> str:
    """The transfer protocol: the topology's, else the first the connector and platform share."""
    if explicit is not None:
        return explicit
    usable = [p for p in connector.protocols if p in PLATFORM_PROTOCOLS.get(platform, ())]
    return usable[0] if usable else connector.protocols[0]
