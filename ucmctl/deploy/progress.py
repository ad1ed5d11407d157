"""The live view of `up`: every process, its node and its state, as they change."""

from __future__ import annotations

import threading
import time
from types import TracebackType

from rich.console import Console
from rich.live import Live
from rich.table import Table

from ucmctl.plan.model import Plan

STYLE = {"healthy": "green", "failed": "red", "waiting for health": "yellow", "starting": "cyan"}


class Progress:
    def __init__(self, plan: Plan, console: Console) -> None:
        self.plan = plan
        self.console = console
        self.state = {p.name: "pending" for p in plan.processes}
        self.since = {p.name: time.monotonic() for p in plan.processes}
        self._lock = threading.Lock()
        self._live: Live | None = None

    def set(self, name: str, state: str) -> None:
        with self._lock:
            self.state[name] = state
            self.since[name] = time.monotonic()
            if self._live is not None:
                self._live.update(self._table())
            else:  # not a terminal: one line per change, for logs and CI
                process = self.plan.process(name)
                self.console.print(f"{name} ({process.node}): {state}", markup=False, highlight=False)

    def _table(self) -> Table:
        table = Table(title=f"deployment {self.plan.deployment}", expand=False)
        for column in ("process", "node", "role", "ports", "state", "for"):
            table.add_column(column)
        now = time.monotonic()
        for p in self.plan.processes:
            state = self.state[p.name]
            ports = ",".join(str(v) for v in p.ports.values())
            style = STYLE.get(state, "dim")
            table.add_row(
                p.name, p.node, p.role, ports, f"[{style}]{state}[/]", f"{now - self.since[p.name]:.0f}s"
            )
        return table

    def __enter__(self) -> Progress:
        if self.console.is_terminal:
            self._live = Live(self._table(), console=self.console, refresh_per_second=4)
            self._live.__enter__()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._live is not None:
            self._live.update(self._table())
            self._live.__exit__(kind, exc, tb)
            self._live = None
