"""Waiting in a test for what it stands for, not a fixed time: `until` polls a condition."""

from __future__ import annotations

import time
from collections.abc import Callable


def until(check: Callable[[], bool], timeout: float = 10.0, every: float = 0.01) -> bool:
    """Whether `check()` holds within `timeout` s, asked every `every` s (once more at the end)."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if check():
            return True
        time.sleep(every)
    return check()
