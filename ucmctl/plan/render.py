"""Render the files placed on nodes from the jinja2 templates in templates/."""

from __future__ import annotations

import json
import shlex
from functools import cache
from pathlib import Path
from typing import Any

import jinja2

_PACKAGE = Path(__file__).resolve().parent.parent


def templates_dir() -> Path:
    """Inside an installed wheel the templates sit in the package; in a checkout, at the top."""
    for candidate in (_PACKAGE / "_templates", _PACKAGE.parent / "templates"):
        if (candidate / "launch.sh.j2").is_file():
            return candidate
    raise FileNotFoundError("ucmctl templates not found; reinstall ucmctl")


@cache
def _environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(templates_dir())),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        autoescape=False,
    )
    env.filters["q"] = lambda v: shlex.quote(str(v))
    env.filters["json"] = _json
    env.filters["command_lines"] = command_lines
    return env


def _json(value: Any) -> str:
    if isinstance(value, float) and value.is_integer():
        value = int(value)  # 32, as the guides write it, not 32.0
    return json.dumps(value)


def command_lines(argv: list[str]) -> list[str]:
    """Quoted argv split into readable lines: the command, then one `--flag value` per line."""
    lines: list[list[str]] = [[]]
    for arg in argv:
        if arg.startswith("--") and lines[-1]:
            lines.append([])
        lines[-1].append(shlex.quote(arg))
    return [" ".join(words) for words in lines]


def render(template: str, **values: Any) -> str:
    return _environment().get_template(template).render(**values)
