"""Exit codes and the one error type that the CLI turns into a clear message."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum


class ExitStatus(IntEnum):
    """What an exit code means to a script or a CI job."""

    OK = 0
    FAILURE = 1  # something ran and failed: a process did not come up (`up`), a node failed a command
    BAD_INPUT = 2  # the user's input is wrong: nothing was started
    NOT_READY = 3  # the nodes failed preflight: nothing was started
    BUSY = 4  # another ucmctl is starting or stopping this deployment: nothing was touched
    REGRESSION = 5  # `bench compare`: a figure is worse than its limit
    REQUESTS_FAILED = 6  # `bench`, `bench suite`: requests failed (counted, left out of the figures)
    INTERRUPTED = 130


@dataclass(frozen=True)
class Problem:
    """One thing wrong with the user's input: what, where, and how to fix it."""

    message: str
    file: str | None = None
    key: str | None = None
    line: int | None = None
    fix: str | None = None

    def render(self) -> str:
        where = ""
        if self.file:
            where = self.file
            if self.line:
                where += f":{self.line}"
        if self.key:
            where = f"{where} {self.key}" if where else self.key
        text = f"{where}: {self.message}" if where else self.message
        if self.fix:
            text += f" ({self.fix})"
        return text


@dataclass
class UcmctlError(Exception):
    """An error the user can act on. The CLI prints each problem on one line, no traceback."""

    problems: list[Problem] = field(default_factory=list)
    status: ExitStatus = ExitStatus.BAD_INPUT

    @classmethod
    def one(cls, message: str, *, status: ExitStatus = ExitStatus.BAD_INPUT, **where: object) -> UcmctlError:
        return cls([Problem(message, **where)], status)  # type: ignore[arg-type]

    def __str__(self) -> str:
        return "\n".join(p.render() for p in self.problems)
