"""UCM config file: the guides' keys load; every mistake is a start-up error naming its key."""

from __future__ import annotations

from pathlib import Path

import pytest
from ucm_connector.config import UCMConfigError, load_config, parse_config

GUIDE_YAML = """\
ucm_connectors:
  - ucm_connector_name: "UcmPipelineStore"
    ucm_connector_config:
      store_pipeline: "Cache|Posix"
      storage_backends: "/mnt/test1"
      cache_buffer_capacity_gb: 64
enable_event_sync: true
use_layerwise: false
"""


def _raw(**store: object) -> dict:
    cfg = {"store_pipeline": "Cache|Posix", "storage_backends": "/mnt/x"}
    cfg.update(store)
    return {"ucm_connectors": [{"ucm_connector_name": "UcmPipelineStore", "ucm_connector_config": cfg}]}


def test_guide_config_loads(tmp_path: Path) -> None:
    f = tmp_path / "ucm.yaml"
    f.write_text(GUIDE_YAML)
    cfg = load_config({"UCM_CONFIG_FILE": str(f)})
    assert cfg.connector_name == "UcmPipelineStore"
    assert cfg.store_config == {
        "store_pipeline": "Cache|Posix",
        "storage_backends": "/mnt/test1",
        "cache_buffer_capacity_gb": 64,
    }
    assert cfg.enable_event_sync is True
    assert cfg.use_layerwise is False
    assert cfg.source == str(f)


def test_missing_file_key_and_missing_file(tmp_path: Path) -> None:
    with pytest.raises(UCMConfigError, match="UCM_CONFIG_FILE: missing"):
        load_config({})
    with pytest.raises(UCMConfigError, match=r"UCM_CONFIG_FILE: cannot read .*nope\.yaml"):
        load_config({"UCM_CONFIG_FILE": str(tmp_path / "nope.yaml")})


def test_bad_yaml(tmp_path: Path) -> None:
    f = tmp_path / "bad.yaml"
    f.write_text("ucm_connectors: [\n")
    with pytest.raises(UCMConfigError, match="not valid YAML"):
        load_config({"UCM_CONFIG_FILE": str(f)})


@pytest.mark.parametrize(
    ("raw", "key"),
    [
        ({"ucm_connectors": []}, "ucm_connectors"),
        (
            {"ucm_connectors": [{"ucm_connector_name": "Nope", "ucm_connector_config": {}}]},
            "ucm_connectors[0].ucm_connector_name",
        ),
        (_raw(store_pipeline="Cache|Ds3fs"), "ucm_connectors[0].ucm_connector_config.store_pipeline"),
        (_raw(storage_backends=""), "ucm_connectors[0].ucm_connector_config.storage_backends"),
        (_raw(cache_buffer_capacity_gb=-1), "cache_buffer_capacity_gb"),
        (_raw(cache_buffer_capacity_gb="big"), "cache_buffer_capacity_gb"),
        ({**_raw(), "use_layerwise": "yes"}, "use_layerwise"),
        ({**_raw(), "enable_event_sync": 1}, "enable_event_sync"),
        ({**_raw(), "use_layerwize": True}, "use_layerwize"),
    ],
)
def test_errors_name_the_key(raw: dict, key: str) -> None:
    with pytest.raises(UCMConfigError) as err:
        parse_config(raw, source="ucm.yaml")
    assert "ucm.yaml" in str(err.value)
    assert key in str(err.value)


def test_unknown_store_name_lists_valid_ones() -> None:
    with pytest.raises(UCMConfigError, match="valid tiers: Cache, Posix"):
        parse_config(_raw(store_pipeline="Mooncake"))


def test_store_keys_are_checked_by_the_connector_and_sizes_by_the_store(tmp_path: Path) -> None:
    """One schema: an unknown store key fails while the file is parsed; what needs the block
    size (the DRAM tier must hold a block) fails when the store opens, naming the file."""
    with pytest.raises(
        UCMConfigError, match=r"ucm\.yaml: ucm_connectors\[0\]\.ucm_connector_config: unknown key .bogus_key."
    ):
        parse_config(_raw(storage_backends=str(tmp_path), bogus_key=1), source="ucm.yaml")
    ucm_store = pytest.importorskip("ucm_store")
    from ucm_connector.store import open_store

    cfg = parse_config(_raw(storage_backends=str(tmp_path), cache_buffer_capacity_gb=1e-6), source="ucm.yaml")
    with pytest.raises(UCMConfigError, match=r"ucm\.yaml: .*cache_buffer_capacity_gb.*at least one block"):
        open_store(cfg, [1 << 20])
    assert issubclass(ucm_store.ConfigError, ValueError)


def test_only_a_store_that_loads_faults_in_read_buffers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The worker's store faults in its I/O threads' read buffers when it opens (its first loads
    must not pay for them); the scheduler's lookup-only store never loads and does not."""
    ucm_store = pytest.importorskip("ucm_store")
    from ucm_connector.store import open_store

    opened: list[tuple[str, bool]] = []
    real = ucm_store.Store.from_config

    def spy(cfg: dict, shard_sizes: list[int], io_prefault: bool = True) -> object:
        opened.append((cfg["store_pipeline"], io_prefault))
        return real(cfg, shard_sizes, io_prefault)

    monkeypatch.setattr(ucm_store.Store, "from_config", spy)
    cfg = parse_config(_raw(storage_backends=str(tmp_path), cache_buffer_capacity_gb=0.01), source="ucm.yaml")
    for lookup_only in (False, True):
        open_store(cfg, [1 << 20], lookup_only=lookup_only).close()
    assert opened == [("Cache|Posix", True), ("Posix", False)]
