"""The UCM config file (`kv_connector_extra_config.UCM_CONFIG_FILE`), as the connector takes it:
read and validated by the one loader (ucmctl.core.ucm_config.load_ucm_config).

Every problem is raised at start-up as a `UCMConfigError` that names the file and the key, so a
typo fails the launch instead of silently running without a cache.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ucmctl.core.ucm_config import (
    DEFAULT_DUMP_TIMEOUT_S,
    DEFAULT_LOAD_TIMEOUT_S,
    TIERS,
    UcmConfig,
    UcmConfigError,
    check_ucm_config,
    load_ucm_config,
)

CONFIG_FILE_KEY = "UCM_CONFIG_FILE"

# The tiers the guides' YAML names, from the file's one schema (ucmctl.core.ucm_config, a leaf
# module of the same wheel: no control plane).
KNOWN_TIERS = TIERS


class UCMConfigError(UcmConfigError):
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
    load_timeout_s: float = DEFAULT_LOAD_TIMEOUT_S
    dump_timeout_s: float = DEFAULT_DUMP_TIMEOUT_S
    pack_blocks: int = 1  # blocks per file on the Posix tier (packs)
    source: str = "<inline>"


def parse_config(raw: Any, source: str = "<inline>") -> UCMConfig:
    """Validate an already-loaded UCM config mapping against the one schema of the file."""
    try:
        store, checked = check_ucm_config(raw, source)
    except UcmConfigError as exc:
        raise UCMConfigError(str(exc)) from None
    return _connector_config(store, checked, source)


def load_config(extra_config: Mapping[str, Any]) -> UCMConfig:
    """Read the file named by `kv_connector_extra_config.UCM_CONFIG_FILE`."""
    path_value = extra_config.get(CONFIG_FILE_KEY)
    if not path_value:
        raise UCMConfigError(
            f"kv_connector_extra_config.{CONFIG_FILE_KEY}: missing; set it to the path of the UCM YAML config"
        )
    path = Path(str(path_value))
    try:
        store, checked = load_ucm_config(path)
    except OSError as exc:
        raise UCMConfigError(
            f"kv_connector_extra_config.{CONFIG_FILE_KEY}: cannot read {path}: {exc.strerror}"
        ) from exc
    except UcmConfigError as exc:
        raise UCMConfigError(str(exc)) from exc.__cause__
    return _connector_config(store, checked, str(path))


def _connector_config(store: dict[str, Any], checked: UcmConfig, source: str) -> UCMConfig:
    return UCMConfig(
        connector_name=checked.connector_name,
        store_config=store,  # as written: the store parses it again
        enable_event_sync=checked.enable_event_sync,
        use_layerwise=checked.use_layerwise,
        wait_persisted=checked.wait_persisted,
        load_timeout_s=checked.load_timeout_s,
        dump_timeout_s=checked.dump_timeout_s,
        pack_blocks=checked.pack_blocks,
        source=source,
    )
