"""tests/support/sleep_audit.py: the seconds slept from test files are summed per call site,
split into fixed sleeps and polls, and sleeps from other code are not counted."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from tests.support.sleep_audit import Audit, wrap_asyncio_sleep, wrap_time_sleep

ROOT = Path(__file__).resolve().parents[3]


class Clock:
    """A clock that a fake sleep moves: no time passes for real."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds

    async def asleep(self, seconds: float, result: object = None) -> object:
        self.now += seconds
        await asyncio.sleep(0)  # the real one, as it yields to the loop
        return result


def audit() -> Audit:
    return Audit(tests=str(ROOT / "tests"), root=str(ROOT))


def test_a_test_files_sleeps_are_summed_per_line_fixed_apart_from_polls() -> None:
    a, clock = audit(), Clock()
    sleep = wrap_time_sleep(a, clock.sleep, clock)
    sleep(1.5)  # fixed
    sleep(0.25)  # fixed, another line
    for _ in range(3):
        sleep(0.1)  # a poll
    here = os.path.relpath(__file__, ROOT)
    assert {(path, line) for path, line in a.sites} == {
        (here, _line("sleep(1.5)")),
        (here, _line("sleep(0.25)")),
        (here, _line("sleep(0.1)")),
    }
    assert sorted((s.polling, s.calls, round(s.seconds, 6)) for s in a.sites.values()) == [
        (False, 1, 0.25),
        (False, 1, 1.5),
        (True, 3, 0.3),
    ]
    assert round(a.total(polling=False), 6) == 1.75 and round(a.total(polling=True), 6) == 0.3
    table = a.table()
    assert table[1].split() == ["1.500", "1", "fixed", f"{here}:{_line('sleep(1.5)')}"]
    assert table[2].split() == ["0.300", "3", "poll", f"{here}:{_line('sleep(0.1)')}"]
    assert table[3].split() == ["0.250", "1", "fixed", f"{here}:{_line('sleep(0.25)')}"]
    assert table[-1] == "fixed sleeps 1.750 s, polls 0.300 s, total 2.050 s"


def test_sleeps_from_code_outside_the_tests_are_not_counted() -> None:
    a, clock = audit(), Clock()
    sleep = wrap_time_sleep(a, clock.sleep, clock)
    elsewhere: dict[str, object] = {"sleep": sleep}
    exec(compile("def nap():\n    sleep(2.0)\n", str(ROOT / "ucmctl" / "nap.py"), "exec"), elsewhere)
    elsewhere["nap"]()  # type: ignore[operator]
    assert clock.now == 2.0  # it slept all the same
    assert a.sites == {} and a.total() == 0.0


def test_an_asyncio_sleep_counts_until_it_returns_or_is_cancelled() -> None:
    a, clock = audit(), Clock()
    asleep = wrap_asyncio_sleep(a, clock.asleep, clock)

    async def main() -> object:
        got = await asleep(0.5, "done")
        stuck = asyncio.ensure_future(asleep(30.0))  # starts: the clock moves 30, then it yields
        await asyncio.sleep(0)
        stuck.cancel()
        return got

    assert asyncio.run(main()) == "done"
    assert sorted(round(s.seconds, 6) for s in a.sites.values()) == [0.5, 30.0]
    assert all(not s.polling and s.calls == 1 for s in a.sites.values())


def test_the_session_prints_its_table(tmp_path: Path) -> None:
    """As a plugin (-p): a session of one test that sleeps once and polls twice."""
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_naps.py").write_text(
        textwrap.dedent("""
        import time

        def test_naps():
            time.sleep(0.02)
            for _ in range(2):
                time.sleep(0.005)
    """)
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "tests.support.sleep_audit", "-p", "no:cacheprovider",
         "--rootdir", str(tmp_path), "-c", os.devnull, str(tmp_path / "tests")],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
    lines = run.stdout.splitlines()
    section = next(i for i, line in enumerate(lines) if "sleeps in tests (sleep_audit)" in line)
    header = ["seconds", "calls", "kind", "site"]
    at = next(i for i in range(section, len(lines)) if lines[i].split() == header)
    fixed, poll = lines[at + 1].split(), lines[at + 2].split()
    assert fixed[1:] == ["1", "fixed", "tests/test_naps.py:5"] and float(fixed[0]) >= 0.02
    assert poll[1:] == ["2", "poll", "tests/test_naps.py:7"] and float(poll[0]) >= 0.01
    assert lines[at + 3].startswith("fixed sleeps ")


def _line(text: str) -> int:
    """The line of this file that holds `text` first."""
    return next(i for i, line in enumerate(Path(__file__).read_text().splitlines(), 1) if text in line)
