"""How the report writes a figure: milliseconds and shares (`-` for one nothing measured)."""

from __future__ import annotations

from typing import Any


def ms(value: Any) -> str:
    """Milliseconds: whole from 100 on, else two decimals."""
    return "-" if value is None else f"{value:.0f}" if value >= 100 else f"{value:.2f}"


def pct(value: float | None) -> str:
    """A share as a percentage, one decimal."""
    return "-" if value is None else f"{100 * value:.1f}%"
