"""Opening the native store (`ucm_store`) and the interface the connector relies on."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from ucm_connector.config import UCMConfig, UCMConfigError
from ucmctl.core.ucm_config import StoreConfig

DEFAULT_PIPELINE: str = StoreConfig.model_fields["store_pipeline"].default

Shard = Any  # (address, nbytes) tuple or a buffer-protocol object
# Per key: None, or (the store key of the block that starts its pack, its index there).
PackRefs = Sequence[tuple[bytes, int] | None]


class TaskResultLike(Protocol):
    ok: list[bool]
    errors: list[str]
    all_ok: bool


class StoreLike(Protocol):
    """The subset of `ucm_store.Store` the connector uses."""

    def lookup(
        self,
        keys: Sequence[bytes],
        tier: str | None = None,
        timeout: float | None = None,
        packs: PackRefs | None = None,
    ) -> list[bool]: ...
    def lookup_prefix(self, keys: Sequence[bytes], timeout: float | None = None) -> int: ...
    def pack_heads(
        self, chain: Sequence[bytes], per_pack: int, timeout: float | None = None
    ) -> list[int]: ...
    def dump(
        self, keys: Sequence[bytes], blocks: Sequence[Sequence[Shard]], packs: PackRefs | None = None
    ) -> int: ...
    def load(
        self, keys: Sequence[bytes], blocks: Sequence[Sequence[Shard]], packs: PackRefs | None = None
    ) -> int: ...
    def wait(self, tid: int, timeout: float | None = None) -> TaskResultLike: ...
    def wait_persisted(self, tid: int, timeout: float | None = None) -> TaskResultLike: ...
    def cancel(self, tid: int, reason: str = ...) -> TaskResultLike: ...
    def finish_within(
        self, tid: int, timeout: float, *, op: str = ..., persisted: bool = ..., stall_s: float | None = ...
    ) -> TaskResultLike: ...
    def check(self, tid: int) -> TaskResultLike | None: ...
    def flush(self, timeout: float | None = None) -> bool: ...
    def stats(self) -> dict[str, Any]: ...
    def close(self) -> None: ...


def store_config_for_role(config: UCMConfig, lookup_only: bool) -> dict[str, Any]:
    """The store config for one process.

    The scheduler process only looks blocks up; its store needs no DRAM cache tier of its
    own (that tier would be a second, empty copy of the worker's), so it gets the persistent
    tiers alone and sees what the workers have persisted.
    """
    cfg: dict[str, Any] = dict(config.store_config)
    if lookup_only:
        tiers = [t for t in str(cfg.get("store_pipeline", DEFAULT_PIPELINE)).split("|") if t != "Cache"]
        if tiers:
            cfg["store_pipeline"] = "|".join(tiers)
            cfg.pop("cache_buffer_capacity_gb", None)
    return cfg


def open_store(config: UCMConfig, shard_sizes: Sequence[int], lookup_only: bool = False) -> StoreLike:
    """Open the native store; a bad config becomes a UCMConfigError naming the file and key."""
    try:
        import ucm_store
    except ImportError as exc:  # the connector has no fallback store by design
        raise RuntimeError(
            "ucm_connector needs the native ucm_store module, which failed to import "
            f"({exc}); reinstall ucmctl (pip install ucmctl) in the vLLM environment"
        ) from exc
    cfg: Mapping[str, Any] = store_config_for_role(config, lookup_only)
    try:
        # A lookup-only store never loads: no read buffers for its I/O threads.
        return ucm_store.Store.from_config(
            dict(cfg), shard_sizes=list(shard_sizes), io_prefault=not lookup_only
        )
    except ucm_store.ConfigError as exc:
        raise UCMConfigError(
            f"UCM config {config.source}: ucm_connectors[0].ucm_connector_config: {exc}"
        ) from exc
