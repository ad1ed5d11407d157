"""How a process is, as a value: what `status`, the watch of a benchmark and `restart` decide on.

A `RunState` is made from what its node answers (ucmctl's supervisor, a systemd unit, a container
runtime, or no answer at all) and turned into words (`words`) only where it is shown.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


class Kind(str, Enum):
    running = "running"
    exited = "exited"  # ended with a code (a container; its runtime may start it again)
    restarting = "restarting"  # ended, and its restart policy starts it again
    gave_up = "gave-up"  # ended after the last restart its policy allows
    stopped = "stopped"  # ended and not started again (stopped, or a clean end)
    no_container = "no-container"  # a contained process whose container is gone
    not_running = "not-running"  # ended, and no supervisor saw how
    unreachable = "unreachable"  # its node did not answer
    other = "other"  # a container in another of its runtime's states (created, paused, ...)


@dataclass(frozen=True)
class RunState:
    """A process's state: its kind and what the kind is told with."""

    kind: Kind
    restarts: int = 0  # by its restart policy since it was started (the runtime's or ucmctl's count)
    exit_code: int | None = None  # how it (last) ended; None: not known
    limit: int = 0  # restarting: the most restarts its policy allows
    detail: str = ""  # other: the runtime's word for the state

    @classmethod
    def up(cls, restarts: int = 0, last_exit: int | None = None) -> RunState:
        return cls(Kind.running, restarts, last_exit)

    @classmethod
    def exited(cls, code: int, restarts: int = 0) -> RunState:
        return cls(Kind.exited, restarts, code)

    @classmethod
    def restarting(cls, last_exit: int, restarts: int, limit: int) -> RunState:
        return cls(Kind.restarting, restarts, last_exit, limit)

    @classmethod
    def gave_up(cls, last_exit: int, restarts: int) -> RunState:
        return cls(Kind.gave_up, restarts, last_exit)

    @classmethod
    def other(cls, detail: str, restarts: int = 0) -> RunState:
        return cls(Kind.other, restarts, detail=detail)

    @property
    def running(self) -> bool:
        return self.kind is Kind.running

    def words(self) -> str:
        """How `status` and the watch say it: `running, restarted 1x (last exit 137)`, `exited (137)`,
        `exited (137), restarting (2 of 3)`, `exited (137) after 3 restarts`, `not running`, ..."""
        restarted = f", restarted {self.restarts}x" if self.restarts else ""
        if self.kind is Kind.running:
            last = f" (last exit {self.exit_code})" if self.restarts and self.exit_code is not None else ""
            return "running" + restarted + last
        if self.kind is Kind.exited:
            return f"exited ({self.exit_code})" + restarted
        if self.kind is Kind.other:
            return self.detail + restarted
        if self.kind is Kind.restarting:
            return f"exited ({self.exit_code}), restarting ({self.restarts + 1} of {self.limit})"
        if self.kind is Kind.gave_up:
            return f"exited ({self.exit_code}) after {self.restarts} restarts"
        return _FIXED[self.kind]


_FIXED = {
    Kind.stopped: "stopped",
    Kind.no_container: "stopped (no container)",
    Kind.not_running: "not running",
    Kind.unreachable: "node unreachable",
}
