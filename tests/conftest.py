"""Every test's `bench` appends to a results history of the test session's own, never to the
user's (~/.ucmctl/history.sqlite); a test that reads the history names its own with --history."""

from __future__ import annotations

import os
import shutil
import tempfile

import pytest

pytest_plugins = ["tests.support.fixtures"]

_FOLDER = tempfile.mkdtemp(prefix="ucmctl-test-history-")


def pytest_configure(config: pytest.Config) -> None:
    os.environ["UCMCTL_HISTORY"] = os.path.join(_FOLDER, "history.sqlite")


def pytest_unconfigure(config: pytest.Config) -> None:
    shutil.rmtree(_FOLDER, ignore_errors=True)
