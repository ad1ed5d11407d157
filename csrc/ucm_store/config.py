"""Validation of the `ucm_connector_config` mapping into native store settings."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

GIB = 1 << 30
TIERS = ("Cache", "Posix")
PIPELINES = ("Cache|Posix", "Posix", "Cache")


class ConfigError(ValueError):
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


# key -> (default, kind); kinds are checked by _coerce.
_KEYS: dict[str, tuple[Any, str]] = {
    "store_pipeline": ("Cache|Posix", "pipeline"),
    "storage_backends": (None, "backends"),
    "cache_buffer_capacity_gb": (4.0, "gb"),
    "posix_capacity_gb": (0.0, "gb0"),
    "io_direct": (False, "bool"),
    "io_fsync": (False, "bool"),
    "cache_copy_threads": (2, "threads"),
    "posix_io_threads": (8, "threads"),
    "lookup_threads": (2, "threads"),
    "cache_prefault": (True, "bool"),
    "cache_on_load": (True, "bool"),
    "stale_temp_s": (3600.0, "seconds"),
    "timeout_ms": (0, "timeout"),
}


def _bad(key: str, value: Any, valid: str) -> ConfigError:
    return ConfigError(f"ucm_connector_config.{key}: invalid value {value!r}; {valid}")


def _parse_pipeline(value: Any) -> tuple[bool, bool]:
    if not isinstance(value, str):
        raise _bad("store_pipeline", value, f"expected one of {', '.join(PIPELINES)}")
    tiers = [t.strip() for t in value.split("|")]
    unknown = [t for t in tiers if t not in TIERS]
    if unknown:
        raise _bad(
            "store_pipeline",
            value,
            f"unknown tier {unknown[0]!r}; valid tiers: {', '.join(TIERS)}; "
            f"valid pipelines: {', '.join(PIPELINES)}",
        )
    if "|".join(tiers) not in PIPELINES:
        raise _bad("store_pipeline", value, f"valid pipelines: {', '.join(PIPELINES)}")
    return "Cache" in tiers, "Posix" in tiers


def _parse_backends(value: Any) -> list[str]:
    if isinstance(value, str):
        paths = [p for p in value.split(":") if p]
    elif isinstance(value, Sequence) and all(isinstance(p, str) for p in value):
        paths = [p for p in value if p]
    else:
        raise _bad("storage_backends", value, "expected absolute paths joined by ':' or a list of them")
    if not paths:
        raise _bad("storage_backends", value, "expected at least one absolute path")
    for p in paths:
        if not os.path.isabs(p):
            raise _bad("storage_backends", value, f"path {p!r} is not absolute")
    return [os.path.normpath(p) for p in paths]


def _coerce(key: str, value: Any, kind: str) -> Any:
    if kind == "bool":
        if not isinstance(value, bool):
            raise _bad(key, value, "expected true or false")
        return value
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if kind in ("gb", "gb0", "seconds"):
        if not number or value < 0 or (kind == "gb" and value == 0):
            valid = "a number of GiB > 0" if kind == "gb" else "a number >= 0"
            if kind == "gb0":
                valid += " (0 = unlimited)"
            raise _bad(key, value, f"expected {valid}")
        return float(value)
    if kind == "threads":
        if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= 256:
            raise _bad(key, value, "expected an integer from 1 to 256")
        return value
    if kind == "timeout":
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise _bad(key, value, "expected an integer number of ms >= 0 (0 = wait forever)")
        return value
    raise AssertionError(kind)


def parse(cfg: Mapping[str, Any], shard_sizes: Sequence[int]) -> StoreSettings:
    """Validates `cfg` (the UCM YAML's `ucm_connector_config`) for blocks of `shard_sizes`."""
    if not isinstance(cfg, Mapping):
        raise ConfigError(f"ucm_connector_config: expected a mapping, got {type(cfg).__name__}")
    unknown = sorted(set(cfg) - set(_KEYS))
    if unknown:
        raise ConfigError(f"ucm_connector_config: unknown key {unknown[0]!r}; valid keys: {', '.join(_KEYS)}")
    v = {k: cfg.get(k, default) for k, (default, _) in _KEYS.items()}
    cache, posix = _parse_pipeline(v["store_pipeline"])
    for key, (_, kind) in _KEYS.items():
        if kind not in ("pipeline", "backends"):
            v[key] = _coerce(key, v[key], kind)
    backends: list[str] = []
    if posix:
        if v["storage_backends"] is None:
            raise ConfigError(
                "ucm_connector_config.storage_backends: missing; the Posix tier needs "
                "absolute paths joined by ':' or a list of them"
            )
        backends = _parse_backends(v["storage_backends"])
    sizes = list(shard_sizes)
    if not sizes or not all(isinstance(s, int) and s > 0 for s in sizes):
        raise ConfigError(f"shard_sizes: invalid value {sizes!r}; expected positive integers")
    block = sum(sizes)
    cache_bytes = int(v["cache_buffer_capacity_gb"] * GIB)
    slot = -(-block // 4096) * 4096
    if cache and cache_bytes < slot:
        raise _bad(
            "cache_buffer_capacity_gb",
            v["cache_buffer_capacity_gb"],
            f"must hold at least one block of {block} bytes ({slot / GIB:.6f} GiB)",
        )
    return StoreSettings(
        cache=cache,
        posix=posix,
        cache_bytes=cache_bytes,
        backends=backends,
        posix_capacity=int(v["posix_capacity_gb"] * GIB),
        io_direct=v["io_direct"],
        io_fsync=v["io_fsync"],
        copy_threads=v["cache_copy_threads"],
        io_threads=v["posix_io_threads"],
        lookup_threads=v["lookup_threads"],
        cache_prefault=v["cache_prefault"],
        cache_on_load=v["cache_on_load"],
        stale_temp_s=v["stale_temp_s"],
        timeout_ms=v["timeout_ms"],
        pipeline="|".join(t for t in TIERS if (t == "Cache" and cache) or (t == "Posix" and posix)),
    )
