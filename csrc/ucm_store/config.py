"""The `ucm_connector_config` mapping as native store settings."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

# The one schema of the UCM config file; a leaf module of the same wheel.
from ucmctl.core.ucm_config import GIB, PIPELINES, TIERS, UcmConfigError, parse_store_config

__all__ = ["GIB", "PIPELINES", "TIERS", "ConfigError", "StoreSettings", "parse"]


class ConfigError(UcmConfigError):
    """A bad store setting; the message names the key, the value and the valid choices."""


@dataclass(frozen=True)
class StoreSettings:
    """Normalised store configuration (what the native store is built from)."""

    cache: bool
    posix: bool
    cache_bytes: int
    backends: list[str]
    posix_capacity: int
    io_direct: bool
    io_fsync: bool
    copy_threads: int
    io_threads: int
    lookup_threads: int
    cache_prefault: bool
    cache_on_load: bool
    stale_temp_s: float
    timeout_ms: int
    pipeline: str = field(default="Cache|Posix")


def _bad(key: str, value: Any, valid: str) -> ConfigError:
    return ConfigError(f"ucm_connector_config.{key}: invalid value {value!r}; {valid}")


def parse(cfg: Mapping[str, Any], shard_sizes: Sequence[int]) -> StoreSettings:
    """Validates `cfg` (the UCM YAML's `ucm_connector_config`) for blocks of `shard_sizes`: the
    keys by the one schema of the UCM config (ucmctl.core.ucm_config), the sizes here."""
    try:
        v = parse_store_config(cfg)
    except UcmConfigError as exc:
        raise ConfigError(str(exc)) from None
    sizes = list(shard_sizes)
    if not sizes or not all(isinstance(s, int) and s > 0 for s in sizes):
        raise ConfigError(f"shard_sizes: invalid value {sizes!r}; expected positive integers")
    block = sum(sizes)
    cache, posix = "Cache" in v.tiers, "Posix" in v.tiers
    cache_bytes = int(v.cache_buffer_capacity_gb * GIB)
    slot = -(-block // 4096) * 4096
    if cache and cache_bytes < slot:
        raise _bad(
            "cache_buffer_capacity_gb",
            v.cache_buffer_capacity_gb,
            f"must hold at least one block of {block} bytes ({slot / GIB:.6f} GiB)",
        )
    return StoreSettings(
        cache=cache,
        posix=posix,
        cache_bytes=cache_bytes,
        backends=[os.path.normpath(b) for b in v.storage_backends] if posix else [],
        posix_capacity=int(v.posix_capacity_gb * GIB),
        io_direct=v.io_direct,
        io_fsync=v.io_fsync,
        copy_threads=v.cache_copy_threads,
        io_threads=v.posix_io_threads,
        lookup_threads=v.lookup_threads,
        cache_prefault=v.cache_prefault,
        cache_on_load=v.cache_on_load,
        stale_temp_s=v.stale_temp_s,
        timeout_ms=v.timeout_ms,
        pipeline=v.store_pipeline,
    )
