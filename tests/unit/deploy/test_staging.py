"""Staging a node in one command: exact bytes and modes, hostile content, the large-file path,
and refusing to overwrite a deployment that still runs."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.support.processes import wait_for
from ucmctl.deploy import staging
from ucmctl.nodes import lifecycle
from ucmctl.nodes.executor import LocalExecutor
from ucmctl.plan.model import NodePlan, PlacedFile, Process, Stage


def node(tmp: Path) -> NodePlan:
    return NodePlan(name="local", host="localhost", transport="local", user="me", ssh_port=22, key=None,
                    platform="cpu", devices=0, python="python3", run_dir=str(tmp),
                    bind="127.0.0.1")  # fmt: skip


def process(tmp: Path, name: str, files: dict[str, tuple[str, int]]) -> Process:
    home = tmp / name
    placed = [PlacedFile(path=str(home / f), content=c, mode=m) for f, (c, m) in files.items()]
    return Process(name=name, role="mixed", node="local", stage=Stage.servers, argv=["true"], env={},
                   launch=str(home / "launch.sh"), files=placed, ports={}, log=str(home / "output.log"),
                   pidfile=str(home / "pid"), health_timeout=60.0)  # fmt: skip


HOSTILE = 'it\'s "quoted" $(touch /tmp/ucmctl-pwned) `id` \\ \n\ttabs and ünïcödé\n'


def test_files_land_byte_exact_with_their_modes(tmp_path: Path) -> None:
    a = process(tmp_path, "a", {"launch.sh": ("#!/bin/sh\necho hi\n", 0o755), "cfg.yaml": (HOSTILE, 0o600)})
    b = process(tmp_path, "b", {"launch.sh": ("", 0o644)})
    assert staging.stage_node(LocalExecutor(node(tmp_path)), [a, b], before=["echo tidied > /dev/null"]) == []
    assert (tmp_path / "a" / "cfg.yaml").read_text() == HOSTILE
    assert (tmp_path / "a" / "cfg.yaml").stat().st_mode & 0o777 == 0o600
    assert (tmp_path / "a" / "launch.sh").stat().st_mode & 0o777 == 0o755
    assert (tmp_path / "b" / "launch.sh").read_text() == ""
    assert not Path("/tmp/ucmctl-pwned").exists()
    assert sorted(p.name for p in tmp_path.rglob("*.staging")) == []


def test_large_file_sets_go_through_put(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    big = "x" * (staging.INLINE_LIMIT + 1)
    p = process(tmp_path, "big", {"launch.sh": (big, 0o755)})
    puts: list[str] = []
    ex = LocalExecutor(node(tmp_path))
    real_put = ex.put

    def put(path: str, content: str | bytes, mode: int = 0o644) -> None:
        puts.append(path)
        real_put(path, content, mode)

    monkeypatch.setattr(ex, "put", put)
    assert staging.stage_node(ex, [p]) == []
    assert puts == [str(tmp_path / "big" / "launch.sh")]
    assert (tmp_path / "big" / "launch.sh").read_text() == big


def test_a_running_process_of_the_deployment_blocks_staging(tmp_path: Path) -> None:
    p = process(tmp_path, "srv", {"launch.sh": ("#!/bin/sh\nexec sleep 30\n", 0o755)})
    ex = LocalExecutor(node(tmp_path))
    assert staging.stage_node(ex, [p]) == []
    started = lifecycle.start(ex, p)
    try:
        changed = process(tmp_path, "srv", {"launch.sh": ("#!/bin/sh\necho new\n", 0o755)})
        assert staging.stage_node(ex, [changed]) == ["srv"]
        assert Path(p.launch).read_text() == "#!/bin/sh\nexec sleep 30\n"  # untouched
    finally:
        assert lifecycle.stop(ex, p, grace=5).was_running
    assert started.pgid > 1
    assert staging.stage_node(ex, [changed]) == []  # stopped: staging goes ahead
    assert Path(p.launch).read_text() == "#!/bin/sh\necho new\n"


def test_a_recycled_pid_without_the_marker_does_not_block(tmp_path: Path) -> None:
    p = process(tmp_path, "srv", {"launch.sh": ("#!/bin/sh\n", 0o755)})
    other = subprocess.Popen(["sleep", "30"], start_new_session=True)  # alive, but not ours
    try:
        # it runs `sleep` (its command line is empty for a moment after Popen returns)
        assert wait_for(lambda: Path(f"/proc/{other.pid}/cmdline").read_bytes() == b"sleep\x0030\x00")
        (tmp_path / "srv").mkdir()
        Path(p.pidfile).write_text(f"{other.pid}\n")
        assert staging.stage_node(LocalExecutor(node(tmp_path)), [p]) == []
    finally:
        other.kill()
        other.wait()
