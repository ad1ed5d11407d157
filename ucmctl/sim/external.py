"""The external KV tier of a simulated instance: the project's native store, real bytes."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from ucmctl.core.ucm_config import UcmConfigError, parse_ucm_config

log = logging.getLogger("ucmctl.sim")


class ExternalTier:
    """Reads and writes whole blocks through `ucm_store`, as the connector does in vLLM.

    A block's bytes are derived from its key, so a load proves the right block came back.
    """

    def __init__(self, ucm_config_file: str, block_bytes: int, shards: int = 4) -> None:
        import ucm_store  # the native store is only needed when the connector is configured

        cfg, self.wait_persisted = load_ucm_config(ucm_config_file)
        shard = max(1, block_bytes // shards)
        self.shard_sizes = [shard] * shards
        self.store = ucm_store.Store.from_config(cfg, shard_sizes=self.shard_sizes)
        self.loaded_blocks = 0
        self.load_failures = 0
        self.saved_blocks = 0

    def lookup_prefix(self, keys: Sequence[bytes]) -> int:
        return self.store.lookup_prefix(list(keys)) if keys else 0

    def load(self, keys: Sequence[bytes]) -> int:
        """Load blocks into fresh buffers and verify them; returns how many leading blocks are good."""
        if not keys:
            return 0
        buffers = [[bytearray(size) for size in self.shard_sizes] for _ in keys]
        result = self.store.wait(self.store.load(list(keys), buffers))
        good = 0
        for key, ok, block in zip(keys, result.ok, buffers, strict=True):
            if not ok or bytes(block[0][:16]) != _pattern(key, 16):
                self.load_failures += 1
                break
            good += 1
        self.loaded_blocks += good
        return good

    def save(self, keys: Sequence[bytes]) -> None:
        if not keys:
            return
        blocks = [[_pattern(key, size) for size in self.shard_sizes] for key in keys]
        task = self.store.dump(list(keys), blocks)
        # As the connector: with wait_persisted the step ends once the blocks are on disk.
        result = self.store.wait_persisted(task) if self.wait_persisted else self.store.wait(task)
        self.saved_blocks += sum(result.ok)
        if not result.all_ok:
            log.warning("sim: %d block dumps failed: %s", len(keys) - sum(result.ok), result.errors[0])

    def close(self) -> None:
        self.store.close()


def _pattern(key: bytes, size: int) -> bytes:
    return (key * (size // len(key) + 1))[:size]


def load_ucm_config(path: str) -> tuple[dict[str, Any], bool]:
    """The `ucm_connector_config` of a UCM config file (checked against the file's one schema,
    as the real connector checks it), and whether dumps wait until persisted."""
    data = yaml.safe_load(Path(path).read_text())
    try:
        checked = parse_ucm_config(data)
    except UcmConfigError as exc:
        raise ValueError(f"UCM config {path}: {exc}") from None
    return dict(data["ucm_connectors"][0]["ucm_connector_config"]), checked.wait_persisted
