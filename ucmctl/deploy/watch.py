"""Watch a deployment while a benchmark runs: every process is looked at every few seconds (alive
as its launcher sees it: process group, container or Slurm step; then its health URL), and one
that dies or stays unhealthy is reported at once as one line, with its last log lines.

A death is reported at the first look that finds it; an unhealthy answer (or an unreachable
node) only after `unhealthy_after` looks in a row, because a loaded server can miss one health
check without being lost. A process reported lost that answers again is reported back. Each
look begins `interval_s` after the last one ended, so a launcher whose looks are slow (a Slurm
job step each) is not asked without pause.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from ucmctl.deploy.health import HealthKind
from ucmctl.deploy.inspect import Look, look, tail_of
from ucmctl.deploy.state import Record
from ucmctl.launch import launcher_for
from ucmctl.nodes.fanout import parallel
from ucmctl.nodes.run_state import Kind
from ucmctl.plan.model import Process

INTERVAL_S = 2.0  # between looks: with a look's own time, a death is reported within ~5 s
UNHEALTHY_AFTER = 2  # looks in a row: a server that misses one health check is not lost
HEALTH_TIMEOUT_S = 3.0  # a loaded server's /health may be slow: within 2 looks, ~10 s
TAIL_LINES = 20


@dataclass(frozen=True)
class Loss:
    """A process found dead or unhealthy while a phase ran."""

    process: str
    node: str
    how: str  # "not running", "exited (137)", "unhealthy (connection refused)", "node unreachable"
    phase: str  # the phase it was noticed in ("" between phases)
    into_s: float  # seconds into that phase
    at: float  # time.monotonic() when noticed
    log_tail: str  # its last log lines

    def line(self) -> str:
        when = f"{self.into_s:.0f} s into {self.phase}" if self.phase else "between phases"
        return f"LOST {self.process} on {self.node}: {self.how}, {when}"

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.pop("at")
        d["into_s"] = round(self.into_s, 1)
        return d


class Watch:
    """Looks at every process of `record` from a thread of its own until stopped; `say` gets one
    line per loss (and per return)."""

    def __init__(
        self,
        record: Record,
        say: Callable[[str], None],
        *,
        interval_s: float = INTERVAL_S,
        unhealthy_after: int = UNHEALTHY_AFTER,
    ) -> None:
        self._record = record
        self._say = say
        self._interval = interval_s
        self._unhealthy_after = unhealthy_after
        self._lock = threading.Lock()
        self._losses: list[Loss] = []
        self._backs: list[tuple[str, float]] = []  # (process, time.monotonic()) it answered again
        self._lost: set[str] = set()  # lost and not back
        self._down_at: dict[float, set[str]] = {}  # a phase's mark: what was lost when it began
        self._bad_looks: dict[str, int] = {}
        self._restart_counts: dict[str, int] = {}  # as the last look saw them
        self._phase = ("", time.monotonic())
        self._stop = threading.Event()
        self.lost_one = threading.Event()  # set at the first loss (for --fail-fast)
        self._thread = threading.Thread(target=self._run, name="ucmctl-watch", daemon=True)

    def __enter__(self) -> Watch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def begin(self, phase: str) -> float:
        """A phase starts now; returns the mark `losses_since` takes."""
        now = time.monotonic()
        with self._lock:
            self._phase = (phase, now)
            self._down_at[now] = set(self._lost)
        return now

    def end(self) -> None:
        with self._lock:
            self._phase = ("", time.monotonic())

    def losses_since(self, mark: float) -> list[Loss]:
        """The losses noticed since `mark`, and those still lost when the phase of `mark` began
        (it ran without them)."""
        with self._lock:
            down = self._down_at.get(mark, set())
            return [
                x for x in self._losses if x.at >= mark or (x.process in down and x is self._last(x.process))
            ]

    def _last(self, process: str) -> Loss:
        return next(x for x in reversed(self._losses) if x.process == process)

    @property
    def losses(self) -> list[Loss]:
        with self._lock:
            return list(self._losses)

    def back_since(self, process: str, mark: float) -> float | None:
        """When `process` was first seen back (running and healthy) after `mark` (monotonic)."""
        with self._lock:
            return next((at for name, at in self._backs if name == process and at >= mark), None)

    def _run(self) -> None:
        launcher = launcher_for(self._record.plan, self._record.allocation, connect_timeout=5)
        try:
            while not self._stop.is_set():
                processes = self._record.plan.processes
                looks = parallel(processes, lambda p: look(launcher, p, HEALTH_TIMEOUT_S))
                for p, now in zip(processes, looks, strict=True):
                    self._judge(launcher, p, now)
                self._stop.wait(self._interval)
        finally:
            launcher.close()

    def _judge(self, launcher: Any, p: Process, now: Look) -> None:
        state, health = now
        before = self._restart_counts.get(p.name)
        reached = state.kind is not Kind.unreachable
        if reached:  # an unreachable node's look knows no count
            self._restart_counts[p.name] = state.restarts
        if before is not None and state.restarts > before and p.name not in self._lost:
            # it ended and was started again between two looks (its restart policy)
            self._lose(launcher, p, state.words())
            return
        running = state.running
        dead = not running and reached
        # a proxy that answers 503 says an upstream is down, which is reported as itself
        unhealthy = health.unhealthy and not (p.role == "proxy" and health.answered)
        bad = dead or not running or unhealthy
        if not bad:
            self._bad_looks.pop(p.name, None)
            if p.name in self._lost:
                with self._lock:
                    self._lost.discard(p.name)
                    self._backs.append((p.name, time.monotonic()))
                told = state.words() + (
                    f", {health.words()}" if health.kind is not HealthKind.not_asked else ""
                )
                self._say(f"BACK {p.name} on {p.node}: {told}")
            return
        seen = self._bad_looks[p.name] = self._bad_looks.get(p.name, 0) + 1
        if p.name in self._lost or (not dead and seen < self._unhealthy_after):
            return
        self._lose(launcher, p, state.words() if not running else health.words())

    def _lose(self, launcher: Any, p: Process, how: str) -> None:
        now = time.monotonic()
        tail = tail_of(launcher, p, TAIL_LINES)
        with self._lock:
            phase, since = self._phase
            loss = Loss(p.name, p.node, how, phase, now - since, now, tail)
            self._losses.append(loss)
            self._lost.add(p.name)
        self._say(loss.line())
        self.lost_one.set()
