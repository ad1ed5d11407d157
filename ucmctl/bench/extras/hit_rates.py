"""The hit rates by role (PD), a preseed that found its prompts cached, and the instances whose
counters were lost (started again) or not read (the phase's core `hit_rate`)."""

from __future__ import annotations

from collections.abc import Iterator

from ucmctl.bench.extras.base import Extra, Note, PhaseView
from ucmctl.bench.formats import pct


def lines(view: PhaseView) -> Iterator[Note]:
    rates = view.phase.hit_rate
    if rates is None:
        return
    by_role = rates.by_role or {}
    if len(by_role) > 1:
        parts = []
        for role, r in by_role.items():
            local, ext = (r or {}).get("local_hit_rate"), (r or {}).get("external_hit_rate")
            parts.append(f"{role} local {pct(local)}, external {pct(ext)}")
        yield Note(f"{view.cell.scenario or 'run'} {view.name} hit rates: " + "; ".join(parts))
    # In PD the decode leg finds what the prefill leg just stored: judge the first leg.
    rate = rates.first_leg()
    if view.key == "preseed" and view.cell.workload_name() == "prefix" and rate is not None and rate > 0.05:
        yield Note(
            f"[yellow]preseed {view.row}: {100 * rate:.1f}% of its prompt tokens were "
            "already cached (a run with the same --seed and --cache-salt before, or a server "
            "that ignores cache_salt?): the measured hit rate includes them; leave out "
            "--cache-salt, use another --seed, or reset the caches[/]",
            markup=None,
        )
    if rates.restarted:
        yield Note(
            f"[yellow]{view.name}: {', '.join(rates.restarted)} started again within the phase: its "
            "hits before that were lost with the old process and are not counted[/]",
            markup=None,
        )
    if rates.missing:
        missing = ", ".join(rates.missing)
        yield Note(f"[yellow]no /metrics from {missing}: hit rate without them[/]", markup=None)


EXTRA = Extra("hit rates", lines)
