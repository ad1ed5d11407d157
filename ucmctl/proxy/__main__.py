"""`python -m ucmctl.proxy ...`: the proxy alone, with the main CLI's error handling (tests, benchmarks)."""

from __future__ import annotations

import sys

import typer

from ucmctl.core.errors import ExitStatus, report
from ucmctl.proxy.cli import proxy


def main() -> None:
    """Run `proxy` as a one-command program: a bad argument is one line and exit code 2."""
    app = typer.Typer(add_completion=False, pretty_exceptions_enable=False)
    app.command()(proxy)
    try:
        app(standalone_mode=False)
    except typer.Exit as exc:
        sys.exit(exc.exit_code)
    except typer.TyperException as exc:  # usage errors: unknown option, bad value
        exc.show()  # type: ignore[attr-defined]
        sys.exit(int(ExitStatus.BAD_INPUT))
    except (typer.Abort, KeyboardInterrupt):
        sys.exit(int(ExitStatus.INTERRUPTED))
    except Exception as exc:
        said = report(exc)
        if said is None:
            raise
        for line in said[0]:
            print(f"error: {line}", file=sys.stderr)
        sys.exit(int(said[1]))


if __name__ == "__main__":
    main()
