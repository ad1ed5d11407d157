"""How long the tests sleep: a pytest plugin, opt-in (`python -m pytest -p tests.support.sleep_audit`).

For the session it wraps `time.sleep` and `asyncio.sleep` and sums the seconds slept by calls
made from a file under tests/ (this module excepted); sleeps inside ucmctl or connector code are
not counted. Each call site is one row of the table printed at the end, sorted by seconds: a
call inside a loop (`while`, `for`) is a poll (its loop waits on a condition and the sleep only
spaces the checks), any other is a fixed sleep, the time a test waits for something it could
await. The seconds are measured (from the call to its return or cancellation).
"""

from __future__ import annotations

import asyncio
import dis
import functools
import inspect
import os
import sys
import threading
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from types import CodeType, FrameType
from typing import Any

import pytest

_HERE = os.path.abspath(__file__)


@dataclass
class Site:
    """One call site: its file (relative to the root), line, and what was slept there."""

    path: str
    line: int
    polling: bool
    calls: int = 0
    seconds: float = 0.0


@dataclass
class Audit:
    """The sleeps of the call sites under `tests`, keyed by (file, line)."""

    tests: str
    root: str
    sites: dict[tuple[str, int], Site] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def site(self, frame: FrameType | None) -> Site | None:
        """The call site of `frame` when its file is under `tests` and is not this module."""
        if frame is None:
            return None
        path = os.path.abspath(frame.f_code.co_filename)
        if path == _HERE or not path.startswith(self.tests + os.sep):
            return None
        key = (os.path.relpath(path, self.root), frame.f_lineno)
        with self._lock:
            if key not in self.sites:
                self.sites[key] = Site(key[0], key[1], in_loop(frame.f_code, frame.f_lasti))
            return self.sites[key]

    def add(self, site: Site, seconds: float) -> None:
        with self._lock:
            site.calls += 1
            site.seconds += seconds

    def total(self, polling: bool | None = None) -> float:
        with self._lock:
            return sum(s.seconds for s in self.sites.values() if polling is None or s.polling == polling)

    def table(self) -> list[str]:
        """The report's lines: one per call site, most seconds first, then the totals."""
        with self._lock:
            rows = sorted(self.sites.values(), key=lambda s: (-s.seconds, s.path, s.line))
        lines = [f"{'seconds':>8} {'calls':>6}  {'kind':<7}  site"]
        for s in rows:
            kind = "poll" if s.polling else "fixed"
            lines.append(f"{s.seconds:8.3f} {s.calls:6d}  {kind:<7}  {s.path}:{s.line}")
        fixed, polling = self.total(polling=False), self.total(polling=True)
        lines.append(f"fixed sleeps {fixed:.3f} s, polls {polling:.3f} s, total {fixed + polling:.3f} s")
        return lines


def in_loop(code: CodeType, offset: int) -> bool:
    """Whether the instruction at `offset` of `code` lies inside a loop: between a backward
    jump's target and the jump (the compiled code, so edits to the file after it was imported
    do not matter)."""
    jumps = set(dis.hasjrel) | set(dis.hasjabs)
    return any(
        i.opcode in jumps and isinstance(i.argval, int) and i.argval <= offset < i.offset
        for i in dis.get_instructions(code)
    )


def wrap_time_sleep(
    audit: Audit, sleep: Callable[[float], None], clock: Callable[[], float] = time.monotonic
) -> Callable[[float], None]:
    """`sleep` that adds the seconds (on `clock`) of the test files' calls to `audit`."""

    @functools.wraps(sleep)
    def audited(seconds: float) -> None:
        site = audit.site(sys._getframe(1))
        if site is None:
            return sleep(seconds)
        start = clock()
        try:
            return sleep(seconds)
        finally:
            audit.add(site, clock() - start)

    return audited


def wrap_asyncio_sleep(
    audit: Audit, sleep: Callable[..., Coroutine[Any, Any, Any]], clock: Callable[[], float] = time.monotonic
) -> Callable[..., Any]:
    """`asyncio.sleep` that adds the seconds (on `clock`) of the test files' calls to `audit`,
    until the sleep returns or is cancelled."""

    @functools.wraps(sleep)
    def audited(delay: float, *args: Any, **kwargs: Any) -> Coroutine[Any, Any, Any]:
        site = audit.site(sys._getframe(1))
        if site is None:
            return sleep(delay, *args, **kwargs)
        return _timed(audit, site, sleep(delay, *args, **kwargs), clock)

    if hasattr(inspect, "markcoroutinefunction"):
        inspect.markcoroutinefunction(audited)
    return audited


async def _timed(
    audit: Audit, site: Site, sleeping: Coroutine[Any, Any, Any], clock: Callable[[], float]
) -> Any:
    start = clock()
    try:
        return await sleeping
    finally:
        audit.add(site, clock() - start)


_AUDIT = pytest.StashKey[Audit]()
_ORIGINALS = pytest.StashKey[tuple[Any, Any]]()


def pytest_configure(config: pytest.Config) -> None:
    root = str(config.rootpath)
    audit = Audit(tests=os.path.join(root, "tests"), root=root)
    config.stash[_AUDIT] = audit
    config.stash[_ORIGINALS] = (time.sleep, asyncio.sleep)
    time.sleep = wrap_time_sleep(audit, time.sleep)  # type: ignore[assignment]
    asyncio.sleep = wrap_asyncio_sleep(audit, asyncio.sleep)  # type: ignore[assignment]


def pytest_unconfigure(config: pytest.Config) -> None:
    if _ORIGINALS in config.stash:
        time.sleep, asyncio.sleep = config.stash[_ORIGINALS]


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    terminalreporter.section("sleeps in tests (sleep_audit)")
    for line in config.stash[_AUDIT].table():
        terminalreporter.write_line(line)
