"""The bad-input corpus: every broken topology gets one clear line, exit code 2, no traceback."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from ucmctl.core.errors import UcmctlError
from ucmctl.topology.load import load_topology

BAD = sorted((Path(__file__).parent / "bad").glob("*.yaml"))


def _expectation(path: Path) -> tuple[str, int | None]:
    text = path.read_text()
    expect = re.search(r"expect: (.+)", text.splitlines()[0])
    assert expect, f"{path.name}: first line must say 'expect: ...'"
    marked = [i for i, line in enumerate(text.splitlines(), 1) if line.rstrip().endswith("# <-")]
    return expect.group(1).strip(), (marked[0] if marked else None)


def test_corpus_is_large_enough() -> None:
    assert len(BAD) >= 20


@pytest.mark.parametrize("path", BAD, ids=[p.stem for p in BAD])
def test_each_broken_topology_is_refused_with_its_reason_and_line(path: Path) -> None:
    expect, line = _expectation(path)
    with pytest.raises(UcmctlError) as caught:
        load_topology(path)
    rendered = [p.render() for p in caught.value.problems]
    matching = [r for r in rendered if expect in r]
    assert matching, f"no problem says {expect!r}; got {rendered}"
    assert all(str(path) in r for r in rendered), "every message names the file"
    if line is not None:
        assert any(f"{path}:{line}" in r for r in matching), f"expected line {line}: {matching}"
    assert caught.value.status == 2


@pytest.mark.parametrize("name", ["07-dtype-mismatch", "01-yaml-syntax", "26-host-metacharacters"])
def test_cli_prints_one_line_per_problem_and_exits_2(name: str) -> None:
    path = Path(__file__).parent / "bad" / f"{name}.yaml"
    expect, _ = _expectation(path)
    run = subprocess.run(
        [sys.executable, "-m", "ucmctl", "validate", str(path)], capture_output=True, text=True
    )
    assert run.returncode == 2
    assert "Traceback" not in run.stderr + run.stdout
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and expect in lines[0]


def test_missing_file_is_bad_input() -> None:
    run = subprocess.run(
        [sys.executable, "-m", "ucmctl", "plan", "/nonexistent/topology.yaml"],
        capture_output=True,
        text=True,
    )
    assert run.returncode == 2
    assert "file not found" in run.stderr and "Traceback" not in run.stderr


def test_unknown_option_is_bad_input() -> None:
    run = subprocess.run([sys.executable, "-m", "ucmctl", "plan", "--bogus"], capture_output=True, text=True)
    assert run.returncode == 2 and "Traceback" not in run.stderr


@pytest.mark.parametrize(
    ("name", "counted"),
    [
        ("local-1p1d", "centralized, 2 API servers on 1 node"),
        ("xpyd", "centralized, 5 API servers on 3 nodes"),
    ],
)
def test_a_good_topology_is_ok_with_its_servers_counted(name: str, counted: str) -> None:
    path = Path(__file__).resolve().parents[3] / "topologies" / f"{name}.yaml"
    run = subprocess.run(
        [sys.executable, "-m", "ucmctl", "validate", str(path)], capture_output=True, text=True
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == f"{path}: ok ({counted})"
