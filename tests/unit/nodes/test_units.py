"""systemd transient units (nodes/units.py) as the shell sees them: the unit's name follows the
process's folder, the start's command line survives a `$` in a path, and what `systemctl show`
says becomes the restarts, the last exit and what the unit does, as `status` words them."""

from __future__ import annotations

import shlex
from dataclasses import dataclass

import pytest

from ucmctl.nodes import lifecycle, units
from ucmctl.plan.model import PlacedFile, Process, RestartPlan, Stage


def process(folder: str, name: str = "decode-0", max_restarts: int = 2) -> Process:
    restart = RestartPlan(by="systemd", max_restarts=max_restarts, backoff_s=1.5, script=f"{folder}/unit.sh")
    return Process(name=name, role="decode", node="a", stage=Stage.servers, argv=["true"], env={},
                   launch=f"{folder}/launch.sh", files=[PlacedFile(path=f"{folder}/launch.sh", content="")],
                   ports={}, log=f"{folder}/output.log", pidfile=f"{folder}/pid", health_timeout=60.0,
                   restart=restart)  # fmt: skip


@dataclass
class Said:
    stdout: str
    ok: bool = True


class Shown:
    """An executor whose every command prints `text` (what `systemctl show` would)."""

    def __init__(self, text: str) -> None:
        self.text, self.commands = text, []  # type: ignore[var-annotated]

    def run(self, command: str, *, timeout: float = 60) -> Said:
        self.commands.append(command)
        return Said(self.text)


def test_the_unit_is_named_after_the_processs_folder() -> None:
    a = units.unit_name(process("/run/ucmctl/d/decode-0"))
    assert a == units.unit_name(process("/run/ucmctl/d/decode-0"))
    assert a.startswith("ucmctl-decode-0-") and a.endswith(".service")
    assert a != units.unit_name(process("/run/ucmctl/other/decode-0"))  # another deployment's


def test_the_start_quotes_every_path_and_doubles_a_dollar_systemd_would_expand() -> None:
    lines = units.spawn_lines(process("/srv/run $HOME [1]/decode-0"))
    assert "/bin/sh '/srv/run $$HOME [1]/decode-0/unit.sh'" in lines
    assert "rm -f '/srv/run $HOME [1]/decode-0/pid'" in lines
    assert "-p StartLimitBurst=3" in lines and "-p RestartSec=1.5" in lines
    words = shlex.split(lines.split("systemd-run", 1)[1].replace("\\\n", " ").split("||")[0])
    assert words[0] == "$S" and f"--unit={units.unit_name(process('/srv/run $HOME [1]/decode-0'))}" in words


@pytest.mark.parametrize(
    ("shown", "expected", "words"),
    [
        (
            "ActiveState=active\nSubState=running\nNRestarts=0\nExecMainCode=0\nExecMainStatus=0",
            (0, 0, "running"),
            "running",
        ),
        (
            "ActiveState=active\nSubState=running\nNRestarts=1\nExecMainCode=0\nExecMainStatus=0",
            (1, 0, "running"),
            "running, restarted 1x",
        ),
        (
            "ActiveState=activating\nSubState=auto-restart\nNRestarts=1\nExecMainCode=2\nExecMainStatus=9",
            (1, 137, "waiting"),
            "exited (137), restarting (2 of 2)",
        ),
        # its limit refused the third start, but systemd counted it
        (
            "ActiveState=failed\nSubState=failed\nNRestarts=3\nExecMainCode=2\nExecMainStatus=9",
            (2, 137, "gave-up"),
            "exited (137) after 2 restarts",
        ),
        (
            "ActiveState=inactive\nSubState=dead\nNRestarts=0\nExecMainCode=1\nExecMainStatus=0",
            (0, 0, "done"),
            "stopped",
        ),
    ],
)
def test_what_systemd_shows_is_what_status_says(shown: str, expected: tuple, words: str) -> None:
    p = process("/w/d/decode-0")
    ex = Shown("LoadState=loaded\n" + shown)
    assert units.state(ex, p) == expected  # type: ignore[arg-type]
    s = lifecycle.supervised(ex, p)  # type: ignore[arg-type]
    assert s is not None and s.run_state(expected[2] == "running", 2).words() == words


def test_no_unit_is_no_state() -> None:
    assert units.state(Shown("LoadState=not-found\nNRestarts=[not set]"), process("/w/d/x")) is None  # type: ignore[arg-type]
