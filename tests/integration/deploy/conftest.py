"""Each test of a real deployment on the test hosts runs `ucmctl` with a state folder of its own."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.cli import Cli
from tests.support.netns import Cluster


@pytest.fixture
def cli(tmp_path: Path, hosts: Cluster) -> Cli:
    return Cli(tmp_path / "home", hosts.ssh_config)
