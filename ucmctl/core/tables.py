"""Tables that keep every name, port and figure whole at any width, 80 columns and a CI log
(rich's default width off a terminal) included.

Rich fits a wide table by shrinking its widest columns first, below their longest word, then
cutting words with an ellipsis or dropping whole columns. Here each column has a kind: NAME
wraps between words (and folds only a word wider than the screen), PAIR ("mean / p99") wraps
after its slash, FIGURE never wraps, TEXT (a message, such as why a process is unhealthy) wraps
and folds its long words (URLs) past TEXT_MIN columns, never dropping a character. The widths
are computed so that no word is cut; where even that does not fit, the table is split in parts
that repeat its leading columns.
"""

from __future__ import annotations

from typing import Any

from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

NAME, FIGURE, PAIR, TEXT = "name", "figure", "pair", "text"
TEXT_MIN = 16  # a TEXT column (a message) is never narrower; a longer word in it folds


def _plain(text: str) -> str:
    return Text.from_markup(text).plain


def widths(columns: list[tuple[str, str]], rows_: list[list[str]], room: int) -> list[int] | None:
    """Content widths that fit `room` columns with every word whole; None when none do. (Rich
    shrinks the widest columns first, below their longest word, then drops columns.)"""
    cells = [[_plain(h), *(_plain(r[i]) for r in rows_)] for i, (h, _) in enumerate(columns)]
    most = [max((len(line) for c in col for line in c.splitlines()), default=1) for col in cells]

    def unit(text: str, kind: str) -> int:  # the widest piece a line break may not split
        if kind == FIGURE:
            return max((len(line) for line in text.splitlines()), default=1)
        if kind == PAIR and " / " in text:  # "mean /" then "p99"
            mean, p99 = text.rsplit(" / ", 1)
            return max(len(mean) + 2, len(p99))
        longest = max((len(w) for w in text.split()), default=1)
        return min(longest, TEXT_MIN) if kind == TEXT else longest

    least = [max(unit(c, kind) for c in col) for col, (_, kind) in zip(cells, columns, strict=True)]
    budget = room - 2 * (len(columns) - 1)  # between two columns: a separator and one blank
    if sum(least) > budget:
        return None
    out = list(most)
    while sum(out) > budget:  # narrow the column with the most room to give, one at a time
        i = max(range(len(out)), key=lambda k: out[k] - least[k])
        out[i] -= 1
    return out


def table(
    title: str | None,
    columns: list[tuple[str, str]],
    rows_: list[list[str]],
    width: int | None = None,
    **kw: Any,
) -> Table:
    """A borderless table whose cells are never cut: `columns` are (header, NAME|FIGURE|PAIR),
    laid out in `width` columns when given (names fold, pairs wrap, figures stay on one line)."""
    sizes = widths(columns, rows_, width) if width else None
    t = Table(
        title=title,
        header_style="bold",
        title_justify="left",
        box=box.SIMPLE_HEAD,
        padding=(0, 1, 0, 0),
        pad_edge=False,
        show_edge=False,
        **kw,
    )
    for i, (header, kind) in enumerate(columns):
        t.add_column(
            header,
            justify="left" if kind in (NAME, TEXT) else "right",
            no_wrap=kind == FIGURE,
            overflow="fold",
            width=sizes[i] if sizes else None,
        )
    for r in rows_:
        t.add_row(*r)
    return t


def fitted(
    console: Console | int,
    title: str | None,
    lead: list[tuple[str, str]],
    columns: list[tuple[str, str]],
    rows_: list[list[str]],
) -> list[Table]:
    """One table, or, where every word whole does not fit the console's width (or this many
    columns), several that each repeat the `lead` columns with as many of the others as fit."""
    n = len(lead)
    room = console if isinstance(console, int) else console.width

    def part(group: list[int]) -> tuple[list[tuple[str, str]], list[list[str]]]:
        return lead + [columns[i] for i in group], [r[:n] + [r[n + i] for i in group] for r in rows_]

    groups: list[list[int]] = [[]]
    for i in range(len(columns)):
        if groups[-1] and widths(*part([*groups[-1], i]), room) is None:
            groups.append([])
        groups[-1].append(i)
    if len(groups) == 1:
        return [table(title, *part(groups[0]), width=room)]
    return [
        table(f"{title} ({k + 1}/{len(groups)})" if title else None, *part(g), width=room)
        for k, g in enumerate(groups)
    ]


def plain(title: str | None, columns: list[tuple[str, str]], rows_: list[list[str]], room: int) -> str | None:
    """The table `table` draws, as text, when every cell fits on one line at its natural width
    within `room` columns (None otherwise: draw it with `fitted`). For long tables: rich takes
    about a millisecond a row, this a microsecond. Cells are taken as they are (no markup)."""
    cells = [[h, *(r[i] for r in rows_)] for i, (h, _) in enumerate(columns)]
    if any("\n" in c for col in cells for c in col):
        return None
    sizes = [max(len(c) for c in col) for col in cells]
    if sum(sizes) + 2 * (len(columns) - 1) > room:
        return None

    def line(values: list[str]) -> str:
        parts = [
            v.ljust(w) if kind in (NAME, TEXT) else v.rjust(w)
            for v, w, (_, kind) in zip(values, sizes, columns, strict=True)
        ]
        return "  ".join(parts)

    width = sum(sizes) + 2 * (len(columns) - 1)
    out = [title] if title else []
    out += [line([h for h, _ in columns]), "─" * width, *(line(r) for r in rows_)]
    return "\n".join(out)
