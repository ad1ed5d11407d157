"""The UCM config file (`ucm_config.yaml`, the guides' format): one schema for everyone who writes
or reads it.

The plan builder renders it from these models, the connector (ucm_connector.config) and the
simulator read the file with `load_ucm_config`, the native store (ucm_store.config) validates
its part with `parse_store_config`, and the topology checks take the valid pipelines from here.
A leaf module: pydantic, PyYAML and the standard library only, so the connector and the store
(same wheel, on the nodes) import it without pulling in the control plane.

Every error names its key and says what is valid, on one line: `UcmConfigError`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from ucmctl.core.errors import Problem, UcmctlError

TIERS = ("Cache", "Posix")  # what the native store implements
PIPELINES = ("Cache|Posix", "Posix", "Cache")  # tiers in the order a block passes them
CONNECTOR_NAMES = ("UcmPipelineStore",)  # `ucm_connector_name`s the connector provides
GIB = 1 << 30
# How long a step waits for its KV loads and dumps before it gives them up (the blocks are
# recomputed, or missed later): see docs/storage.md for the measurement behind the defaults.
DEFAULT_LOAD_TIMEOUT_S = 5.0
DEFAULT_DUMP_TIMEOUT_S = 10.0


# Under the slowest a healthy load moved here: 0.13 GB/s, a 4 GiB load (a 32k-token prompt of an
# 8B-class model) through a GlusterFS FUSE mount right after it was stored (benchmarks/RESULTS.md).
# A load's bound grows by its bytes at this rate, so the healthy load of a long prompt is not given
# up; storage that stopped is found sooner than any bound: no block back for `stall_bound` s.
LOAD_FLOOR_BYTES_PER_S = 0.1e9


def load_bound(load_timeout_s: float, nbytes: int) -> float:
    """How long a load of `nbytes` may take in all before it is given up (and recomputed)."""
    return load_timeout_s + nbytes / LOAD_FLOOR_BYTES_PER_S


def stall_bound(load_timeout_s: float) -> float:
    """How long a load or a persist may go with no block coming back from the storage before
    the storage counts as stalled: as long as a lookup may take."""
    return lookup_bound(load_timeout_s)


def lookup_bound(load_timeout_s: float) -> float:
    """How long a lookup may take: half the load bound, because in disaggregated PD a request
    is looked up on both sides (prefill, then decode), and both together must fit the bound."""
    return load_timeout_s / 2


class UcmConfigError(UcmctlError, ValueError):
    """A bad UCM config; the message names the key, the value and the valid choices."""

    def __init__(self, message: str) -> None:
        super().__init__([Problem(message)])


def _invalid(value: Any, valid: str) -> ValueError:
    return ValueError(f"invalid value {value!r}; {valid}")


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    @model_validator(mode="before")
    @classmethod
    def _known_keys(cls, data: Any) -> Any:
        """Unknown keys are errors that list the valid ones (a typo must not be ignored)."""
        if not isinstance(data, Mapping):
            raise ValueError(f"expected a mapping, got {type(data).__name__}")
        unknown = sorted(set(data) - set(cls.model_fields))
        if unknown:
            raise ValueError(f"unknown key {unknown[0]!r}; valid keys: {', '.join(cls.model_fields)}")
        return data


class StoreConfig(_Strict):
    """`ucm_connector_config`: the store's settings (defaults are the native store's)."""

    store_pipeline: str = "Cache|Posix"
    storage_backends: list[str] = Field(default_factory=list)  # absolute
    cache_buffer_capacity_gb: float = 4.0
    posix_capacity_gb: float = 0.0  # 0 = unlimited
    io_direct: bool = False
    io_fsync: bool = False
    cache_copy_threads: int = 2
    posix_io_threads: int = 8
    lookup_threads: int = 2
    cache_prefault: bool = True
    cache_on_load: bool = True
    stale_temp_s: float = 3600.0
    timeout_ms: int = 0  # 0 = wait forever

    @field_validator("store_pipeline", mode="before")
    @classmethod
    def _pipeline(cls, value: Any) -> str:
        if not isinstance(value, str):
            raise _invalid(value, f"expected one of {', '.join(PIPELINES)}")
        tiers = [t.strip() for t in value.split("|")]
        unknown = [t for t in tiers if t not in TIERS]
        if unknown:
            raise _invalid(
                value,
                f"unknown tier {unknown[0]!r}; valid tiers: {', '.join(TIERS)}; "
                f"valid pipelines: {', '.join(PIPELINES)}",
            )
        if "|".join(tiers) not in PIPELINES:
            raise _invalid(value, f"valid pipelines: {', '.join(PIPELINES)}")
        return "|".join(tiers)

    @field_validator("storage_backends", mode="before")
    @classmethod
    def _backends(cls, value: Any) -> list[str]:
        if isinstance(value, str):
            paths = [p for p in value.split(":") if p]
        elif isinstance(value, Sequence) and all(isinstance(p, str) for p in value):
            paths = [p for p in value if p]
        else:
            raise _invalid(value, "expected absolute paths joined by ':' or a list of them")
        if not paths:
            raise _invalid(value, "expected at least one absolute path")
        for p in paths:
            if not os.path.isabs(p):
                raise _invalid(value, f"path {p!r} is not absolute")
        return paths  # as written (values round-trip); the store normalises them where it opens them

    @field_validator("cache_buffer_capacity_gb", mode="before")
    @classmethod
    def _positive_gb(cls, value: Any) -> float:
        if not _number(value) or value <= 0:
            raise _invalid(value, "expected a number of GiB > 0")
        return float(value)

    @field_validator("posix_capacity_gb", "stale_temp_s", mode="before")
    @classmethod
    def _non_negative(cls, value: Any, info: Any) -> float:
        if not _number(value) or value < 0:
            unlimited = " (0 = unlimited)" if info.field_name == "posix_capacity_gb" else ""
            raise _invalid(value, f"expected a number >= 0{unlimited}")
        return float(value)

    @field_validator("io_direct", "io_fsync", "cache_prefault", "cache_on_load", mode="before")
    @classmethod
    def _bool(cls, value: Any) -> bool:
        if not isinstance(value, bool):
            raise _invalid(value, "expected true or false")
        return value

    @field_validator("cache_copy_threads", "posix_io_threads", "lookup_threads", mode="before")
    @classmethod
    def _threads(cls, value: Any) -> int:
        if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= 256:
            raise _invalid(value, "expected an integer from 1 to 256")
        return value

    @field_validator("timeout_ms", mode="before")
    @classmethod
    def _timeout(cls, value: Any) -> int:
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise _invalid(value, "expected an integer number of ms >= 0 (0 = wait forever)")
        return value

    @model_validator(mode="after")
    def _posix_needs_backends(self) -> StoreConfig:
        if "Posix" in self.tiers and not self.storage_backends:
            raise ValueError(
                "storage_backends: missing; the Posix tier needs absolute paths joined by ':' "
                "or a list of them"
            )
        return self

    @property
    def tiers(self) -> list[str]:
        return self.store_pipeline.split("|")


class ConnectorEntry(_Strict):
    ucm_connector_name: str
    ucm_connector_config: StoreConfig

    @field_validator("ucm_connector_name", mode="before")
    @classmethod
    def _name(cls, value: Any) -> str:
        if value not in CONNECTOR_NAMES:
            raise ValueError(f"unknown connector {value!r}; valid: {', '.join(CONNECTOR_NAMES)}")
        return str(value)


class UcmConfig(_Strict):
    """The whole file."""

    ucm_connectors: list[ConnectorEntry]
    enable_event_sync: bool = True  # order device copies with events, not syncs
    use_layerwise: bool = False
    # Finish a step's dumps only once they are in the last (shared) tier: in disaggregated PD the
    # prefill instance must not answer before the decode instance can find its blocks.
    wait_persisted: bool = False
    # A load not finished by then is given up and the request recomputes those blocks (vLLM's
    # kv_load_failure_policy "recompute"); a dump not stored (or, with wait_persisted, not
    # persisted) by then is given up and counted as a save error: one stalled mount must not
    # freeze a server.
    load_timeout_s: float = DEFAULT_LOAD_TIMEOUT_S
    dump_timeout_s: float = DEFAULT_DUMP_TIMEOUT_S
    # Blocks per file on the Posix tier: consecutive blocks of a prompt written as one pack
    # (csrc/README.md, "Packs"), so a network filesystem pays its per-file round trips once
    # per pack. 1 = a file per block. Aim for packs of ~16 MiB: 16 MiB / one rank's block bytes.
    pack_blocks: int = 1

    @field_validator("ucm_connectors", mode="before")
    @classmethod
    def _one(cls, value: Any) -> Any:
        if not isinstance(value, list) or not value:
            raise ValueError("must be a non-empty list")
        if len(value) != 1:
            raise ValueError(f"exactly one entry is supported, got {len(value)}")
        return value

    @field_validator("enable_event_sync", "use_layerwise", "wait_persisted", mode="before")
    @classmethod
    def _bool(cls, value: Any) -> bool:
        if not isinstance(value, bool):
            raise ValueError(f"must be true or false, got {value!r}")
        return value

    @field_validator("load_timeout_s", "dump_timeout_s", mode="before")
    @classmethod
    def _timeout_s(cls, value: Any) -> float:
        if not _number(value) or not 0 < value < 86400:
            raise ValueError(f"must be a number of seconds > 0 (and < 86400), got {value!r}")
        return float(value)

    @field_validator("pack_blocks", mode="before")
    @classmethod
    def _pack_blocks(cls, value: Any) -> int:
        if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= 4096:
            raise ValueError(f"must be an integer from 1 (a file per block) to 4096, got {value!r}")
        return value

    @property
    def store(self) -> StoreConfig:
        return self.ucm_connectors[0].ucm_connector_config

    @property
    def connector_name(self) -> str:
        return self.ucm_connectors[0].ucm_connector_name


def _first_error(exc: ValidationError, prefix: str) -> str:
    """`prefix.key.path: message` of the first problem pydantic found."""
    err = exc.errors()[0]
    path = prefix
    for part in err["loc"]:
        path += f"[{part}]" if isinstance(part, int) else f".{part}" if path else str(part)
    cause = (err.get("ctx") or {}).get("error")
    message = str(cause) if cause is not None else err["msg"]
    if err["type"] == "missing":
        message = "missing"
    if message.startswith("storage_backends: "):  # raised for the whole mapping, about one key
        path, message = f"{path}.storage_backends" if path else "storage_backends", message[18:]
    return f"{path or '<top level>'}: {message}"


def parse_store_config(cfg: Any, prefix: str = "ucm_connector_config") -> StoreConfig:
    """Validate `ucm_connector_config`; a problem is one `UcmConfigError` naming `prefix.key`."""
    try:
        return StoreConfig.model_validate(cfg)
    except ValidationError as exc:
        raise UcmConfigError(_first_error(exc, prefix)) from None


def parse_ucm_config(raw: Any) -> UcmConfig:
    """Validate a loaded UCM config file; a problem is one `UcmConfigError` naming its key path."""
    try:
        return UcmConfig.model_validate(raw)
    except ValidationError as exc:
        raise UcmConfigError(_first_error(exc, "")) from None


def check_ucm_config(raw: Any, source: str) -> tuple[dict[str, Any], UcmConfig]:
    """The `ucm_connector_config` of a loaded UCM config file as written (the store parses it
    itself), and the whole file checked; a problem is one `UcmConfigError`, "UCM config
    <source>: <key path>: <what is wrong>"."""
    try:
        checked = parse_ucm_config(raw)
    except UcmConfigError as exc:
        raise UcmConfigError(f"UCM config {source}: {exc}") from None
    return dict(raw["ucm_connectors"][0]["ucm_connector_config"]), checked


def load_ucm_config(path: str | os.PathLike[str]) -> tuple[dict[str, Any], UcmConfig]:
    """The UCM config file at `path`, read and checked as `check_ucm_config` says. OSError
    when it cannot be read; a `UcmConfigError` when it is not YAML or not valid."""
    text = Path(path).read_text()
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise UcmConfigError(f"UCM config {path}: not valid YAML: {exc}") from exc
    return check_ucm_config(raw, str(path))
