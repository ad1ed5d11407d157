"""The one loader of the UCM config file: the connector and the simulator read it through
`load_ucm_config`, so both see the same file the same way and say the same about a bad one."""

from __future__ import annotations

from pathlib import Path

import pytest

from ucmctl.core.ucm_config import UcmConfigError, load_ucm_config

GOOD = """\
ucm_connectors:
  - ucm_connector_name: UcmPipelineStore
    ucm_connector_config:
      {store_pipeline: "Cache|Posix", storage_backends: /mnt/a, cache_buffer_capacity_gb: 8}
wait_persisted: true
pack_blocks: 4
"""


def test_the_store_part_as_written_and_the_file_checked(tmp_path: Path) -> None:
    f = tmp_path / "ucm.yaml"
    f.write_text(GOOD)
    store, checked = load_ucm_config(f)
    assert store == {
        "store_pipeline": "Cache|Posix",
        "storage_backends": "/mnt/a",
        "cache_buffer_capacity_gb": 8,
    }
    assert (checked.wait_persisted, checked.pack_blocks, checked.load_timeout_s) == (True, 4, 5.0)
    assert checked.store.storage_backends == ["/mnt/a"]


def test_each_problem_names_the_file(tmp_path: Path) -> None:
    f = tmp_path / "ucm.yaml"
    f.write_text("ucm_connectors: [\n")
    with pytest.raises(UcmConfigError, match=f"^UCM config {f}: not valid YAML: "):
        load_ucm_config(f)
    f.write_text(GOOD.replace("pack_blocks: 4", "pack_blocks: 0"))
    with pytest.raises(UcmConfigError) as caught:
        load_ucm_config(str(f))
    assert str(caught.value) == (
        f"UCM config {f}: pack_blocks: must be an integer from 1 (a file per block) to 4096, got 0"
    )
    with pytest.raises(FileNotFoundError):
        load_ucm_config(tmp_path / "nope.yaml")
