"""Render rich output as a CI log sees it: 80 columns, no terminal, trailing blanks dropped."""

from __future__ import annotations

from collections.abc import Callable
from io import StringIO

from rich.console import Console


def at_width(draw: Callable[[Console], None], width: int = 80) -> str:
    buf = StringIO()
    console = Console(file=buf, width=width, force_terminal=False, highlight=False, emoji=False)
    draw(console)
    return "\n".join(line.rstrip() for line in buf.getvalue().splitlines()) + "\n"
