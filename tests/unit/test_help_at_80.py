"""Every command's --help as a user reads it at 80 columns: no line wider, no help cut short
(rich's panels cut the longer option help with an ellipsis; click's layout wraps it), and the
command lists show each command's whole short help."""

from __future__ import annotations

from typing import Any

import pytest
import typer.main
from typer.testing import CliRunner

from ucmctl.cli import app

ROOT = typer.main.get_command(app)


def _paths(cmd: Any, path: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    found = [path]
    for name, sub in getattr(cmd, "commands", {}).items():  # a group's (typer has its own click)
        found += _paths(sub, (*path, name))
    return found


PATHS = [p for p in _paths(ROOT) if p != ("sim", "serve")]  # serve's --help is vLLM's own flags


def test_every_command_is_listed() -> None:
    assert {("up",), ("bench", "compare"), ("image", "build"), ("model", "make-tiny")} <= set(PATHS)


@pytest.mark.parametrize("path", PATHS, ids=[" ".join(p) or "ucmctl" for p in PATHS])
def test_help_fits_80_columns_whole(path: tuple[str, ...]) -> None:
    done = CliRunner().invoke(app, [*path, "--help"], terminal_width=80, env={"COLUMNS": "80"})
    assert done.exit_code == 0, done.output
    lines = done.output.splitlines()
    assert lines and max(len(line) for line in lines) <= 80, done.output
    assert "…" not in done.output and "╭" not in done.output, done.output
    listed = lines[lines.index("Commands:") + 1 :] if "Commands:" in lines else []
    assert not [line for line in listed if line.rstrip().endswith("...")], done.output
