"""The UCM config file (`kv_connector_extra_config.UCM_CONFIG_FILE`): load and validate.

Every problem is raised at start-up as a `UCMConfigError` that names the file and the key, so a
typo fails the launch instead of silently running without a cache.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

CONFIG_FILE_KEY = "UCM_CONFIG_FILE"

# Connector implementations this package provides, by the name used in the guides' YAML.
KNOWN_CONNECTORS = ("UcmPipelineStore",)
# Tiers the native store implements; a pipeline is one or more joined by "|".
KNOWN_TIERS = ("Cache", "Posix")
_TOP_LEVEL_KEYS = {"ucm_connectors", "enable_event_sync", "use_layerwise", "wait_persisted"}


class UCMConfigError(ValueError):
    """The UCM config is missing or wrong; the message names the file and the key."""


@dataclass(frozen=True)
class UCMConfig:
    """What the connector needs from the UCM config file."""

    connector_name: str
    store_config: dict[str, Any] = field(default_factory=dict)
    enable_event_sync: bool = True
    use_layerwise: bool = False
    # Finish a step's dumps only once they are in the last (shared) tier: in disaggregated PD
    # the prefill instance must not answer before the decode instance can find its blocks.
    wait_persisted: bool = False
    source: str = "<inline>"


def _fail(source: str, key: str, problem: str) -> UCMConfigError:
    return UCMConfigError(f"UCM config {source}: {key}: {problem}")


def _as_bool(source: str, key: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    raise _fail(source, key, f"must be true or false, got {value!r}")


def parse_config(raw: Any, source: str = "<inline>") -> UCMConfig:
    """Validate an already-loaded UCM config mapping."""
    if not isinstance(raw, Mapping):
        raise _fail(source, "<top level>", "must be a mapping with a 'ucm_connectors' list")
    unknown = sorted(set(raw) - _TOP_LEVEL_KEYS)
    if unknown:
        raise _fail(source, unknown[0], f"unknown key; valid keys: {', '.join(sorted(_TOP_LEVEL_KEYS))}")
    connectors = raw.get("ucm_connectors")
    if not isinstance(connectors, list) or not connectors:
        raise _fail(source, "ucm_connectors", "must be a non-empty list")
    if len(connectors) != 1:
        raise _fail(source, "ucm_connectors", f"exactly one entry is supported, got {len(connectors)}")
    entry = connectors[0]
    if not isinstance(entry, Mapping):
        raise _fail(source, "ucm_connectors[0]", "must be a mapping")
    name = entry.get("ucm_connector_name")
    if name not in KNOWN_CONNECTORS:
        raise _fail(
            source,
            "ucm_connectors[0].ucm_connector_name",
            f"unknown connector {name!r}; valid: {', '.join(KNOWN_CONNECTORS)}",
        )
    store_cfg = entry.get("ucm_connector_config")
    if not isinstance(store_cfg, Mapping):
        raise _fail(source, "ucm_connectors[0].ucm_connector_config", "must be a mapping")
    store_cfg = dict(store_cfg)
    prefix = "ucm_connectors[0].ucm_connector_config"
    pipeline = store_cfg.get("store_pipeline")
    if not isinstance(pipeline, str) or not pipeline:
        raise _fail(source, f"{prefix}.store_pipeline", "must be a string such as 'Cache|Posix'")
    for tier in pipeline.split("|"):
        if tier not in KNOWN_TIERS:
            raise _fail(
                source,
                f"{prefix}.store_pipeline",
                f"unknown store {tier!r} in {pipeline!r}; valid tiers: {', '.join(KNOWN_TIERS)}",
            )
    if "Posix" in pipeline.split("|"):
        backends = store_cfg.get("storage_backends")
        if not isinstance(backends, str) or not backends.strip(":"):
            raise _fail(
                source, f"{prefix}.storage_backends", "must name one or more directories joined by ':'"
            )
    if "Cache" in pipeline.split("|"):
        cap = store_cfg.get("cache_buffer_capacity_gb")
        if cap is not None and (isinstance(cap, bool) or not isinstance(cap, (int, float)) or cap <= 0):
            raise _fail(
                source, f"{prefix}.cache_buffer_capacity_gb", f"must be a positive number, got {cap!r}"
            )
    return UCMConfig(
        connector_name=str(name),
        store_config=store_cfg,
        enable_event_sync=_as_bool(source, "enable_event_sync", raw.get("enable_event_sync", True)),
        use_layerwise=_as_bool(source, "use_layerwise", raw.get("use_layerwise", False)),
        wait_persisted=_as_bool(source, "wait_persisted", raw.get("wait_persisted", False)),
        source=source,
    )


def load_config(extra_config: Mapping[str, Any]) -> UCMConfig:
    """Read the file named by `kv_connector_extra_config.UCM_CONFIG_FILE`."""
    path_value = extra_config.get(CONFIG_FILE_KEY)
    if not path_value:
        raise UCMConfigError(
            f"kv_connector_extra_config.{CONFIG_FILE_KEY}: missing; set it to the path of the UCM YAML config"
        )
    path = Path(str(path_value))
    try:
        text = path.read_text()
    except OSError as exc:
        raise UCMConfigError(
            f"kv_connector_extra_config.{CONFIG_FILE_KEY}: cannot read {path}: {exc.strerror}"
        ) from exc
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise UCMConfigError(f"UCM config {path}: not valid YAML: {exc}") from exc
    return parse_config(raw, source=str(path))
