"""What the scheduler side tells the worker side each step (plain, picklable data)."""

from __future__ import annotations

from dataclasses import dataclass, field

from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorMetadata


@dataclass
class BlockTransfer:
    """Whole blocks of one request to move between the paged KV cache and the store."""

    req_id: str
    keys: list[bytes]
    block_ids: list[int]
    # With packs: per block, the block key of the block that starts its pack, and its index there.
    packs: list[tuple[bytes, int]] | None = None

    def __post_init__(self) -> None:
        if len(self.keys) != len(self.block_ids):
            raise ValueError(f"request {self.req_id}: {len(self.keys)} keys for {len(self.block_ids)} blocks")
        if self.packs is not None and len(self.packs) != len(self.keys):
            raise ValueError(
                f"request {self.req_id}: {len(self.packs)} pack references for {len(self.keys)} blocks"
            )


@dataclass
class UCMConnectorMetadata(KVConnectorMetadata):
    """Loads run before this step's forward; saves run after it (or per layer)."""

    loads: list[BlockTransfer] = field(default_factory=list)
    saves: list[BlockTransfer] = field(default_factory=list)

    @property
    def empty(self) -> bool:
        return not self.loads and not self.saves
