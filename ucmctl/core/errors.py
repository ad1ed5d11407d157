"""Exit codes, and the one root of the errors the CLI turns into a clear message."""

from __future__ import annotations

from dataclasses import dataclass
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


class UcmctlError(Exception):
    """The root of every error ucmctl raises for a user: one or more Problems (what, where, the
    fix) and the exit status. `ucmctl`'s entry point prints each problem on one line, no
    traceback (`report`); subclasses say what failed (a node, a scheduler, a config file)."""

    status: ExitStatus = ExitStatus.BAD_INPUT

    def __init__(self, problems: list[Problem] | None = None, status: ExitStatus | None = None) -> None:
        self.problems: list[Problem] = list(problems or [])
        if status is not None:
            self.status = status
        super().__init__(str(self))

    @classmethod
    def one(cls, message: str, *, status: ExitStatus = ExitStatus.BAD_INPUT, **where: object) -> UcmctlError:
        return UcmctlError([Problem(message, **where)], status)  # type: ignore[arg-type]

    def __str__(self) -> str:
        return "\n".join(p.render() for p in self.problems)

    def __reduce__(self) -> tuple[object, ...]:
        # Whatever a subclass's constructor takes, a copy (a worker process's error) is the same.
        return _rebuilt, (type(self), dict(self.__dict__))


def _rebuilt(cls: type[UcmctlError], state: dict[str, object]) -> UcmctlError:
    exc = cls.__new__(cls)
    exc.__dict__.update(state)
    Exception.__init__(exc, str(exc))
    return exc


def report(exc: BaseException) -> tuple[list[str], ExitStatus] | None:
    """A user's error as the lines to print and the exit status; None for a bug (which keeps
    its traceback). The one place where errors become what the user sees."""
    if isinstance(exc, UcmctlError):
        return [p.render() for p in exc.problems], exc.status
    if isinstance(exc, OSError) and exc.filename is not None:  # --save into a missing folder ...
        return [f"{exc.filename}: {exc.strerror or exc}"], ExitStatus.BAD_INPUT
    return None
