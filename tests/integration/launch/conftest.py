"""`ucmctl` as a user on the login node of the module's Slurm site (tests/support/fixtures.py) runs it."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.cli import Cli
from tests.support.slurm import Site


@pytest.fixture
def cli(tmp_path: Path, site: Site) -> Cli:
    """`ucmctl` as a user on the login node runs it (SLURM_CONF is the site's)."""
    return Cli(tmp_path / "home", env=site.slurm.env)
