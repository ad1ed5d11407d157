"""Fixtures for end-to-end tests against a real `vllm serve` on the CPU."""

from __future__ import annotations

import os
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def e2e_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("e2e")


@pytest.fixture(scope="session")
def compile_cache(e2e_root: Path) -> Path:
    # One torch.compile cache for every server of the session: later starts reuse it.
    path = Path(os.environ.get("UCM_E2E_COMPILE_CACHE", e2e_root / "vllm-cache"))
    path.mkdir(parents=True, exist_ok=True)
    return path


@pytest.fixture(scope="session")
def tiny_model(e2e_root: Path) -> Path:
    from ucmctl.tinymodel import make_model

    return make_model(e2e_root / "tiny", size="tiny", seed=0)
