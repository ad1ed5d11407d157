"""What names a cell of a result, and the hit rate read against its ideal (`results.Cell` and
`results.HitRate` read them): light, without the report's pandas."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def workload_of(cell: dict[str, Any]) -> str:
    return str(cell.get("workload") or "prefix")


def label_of(cell: dict[str, Any]) -> str:
    """A cell's row name: its label, else (results before labels) its input length."""
    return str(cell.get("label") or cell["input_len"])


def row_name(cell: dict[str, Any]) -> str:
    """The label, and the sweep point when the run swept several."""
    point = cell.get("point_name")
    return f"{label_of(cell)} @ {point}" if point else label_of(cell)


def cell_key(cell: dict[str, Any]) -> str:
    """What `bench compare` pairs cells by (with the scenario): the row name, by workload."""
    workload = workload_of(cell)
    return row_name(cell) if workload == "prefix" else f"{workload}: {row_name(cell)}"


def first_leg_of(rates: Mapping[str, Any] | None) -> float | None:
    """Of a phase's measured hit rates (its `hit_rate`): the share of prompt tokens not computed
    (local or external hit) where a request first lands: prefill in PD (decode then finds what
    prefill just stored), else every instance. This is what the workload's ideal hit rate is
    read against."""
    rates = rates or {}
    by_role = rates.get("by_role") or {}
    leg = by_role.get("prefill") or by_role.get("mixed")
    return (leg or rates.get("total") or {}).get("hit_rate")
