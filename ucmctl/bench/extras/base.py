"""What a per-phase extra is: the fields it adds to a phase (a pydantic model that
`results.Phase` inherits) and the lines it says under the report's tables for one phase."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

from ucmctl.bench.open_model import Open

if TYPE_CHECKING:
    from ucmctl.bench.results import Cell, Phase


class Fields(Open):
    """An extra's fields on a phase: each optional, absent from phases that did not record it."""


class Note(NamedTuple):
    """One line under the tables: its text, its style, and whether the text is rich markup
    (None: the console's default, markup read)."""

    text: str
    style: str | None = None
    markup: bool | None = False


@dataclass(frozen=True)
class PhaseView:
    """One phase of one cell as an extra reads it."""

    key: str  # "preseed" or "measure"
    name: str  # the phase as its workload names it, then the cell's row name
    row: str  # the cell's row name
    cell: Cell
    phase: Phase


@dataclass(frozen=True)
class Extra:
    """A per-phase extra: its name, its lines for one phase (none for a phase without its
    figures), and its fields (None: it reads the phase's core, its errors or hit rates)."""

    name: str
    lines: Callable[[PhaseView], Iterable[Note]]
    fields: type[Fields] | None = None
