"""What the `ucmctl bench` commands share: the consoles, the progress bars, the option parsers
that several use, and the steps after a run (outputs, history, exit status)."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from ucmctl.bench import loop
from ucmctl.core.errors import ExitStatus, UcmctlError

if TYPE_CHECKING:
    from ucmctl.bench.client import RequestResult
    from ucmctl.bench.results import Cell
    from ucmctl.bench.workloads import WorkloadSpec

SALT_HELP = (
    "vLLM's cache_salt in every request (default: one of this run's own, so no block of an "
    "earlier run is a hit; a value reuses its blocks on purpose; off: none)"
)
HISTORY_HELP = (
    "results history this run is appended to (default $UCMCTL_HISTORY, else "
    "~/.ucmctl/history.sqlite; off: none)"
)
out = Console(highlight=False, soft_wrap=True, emoji=False)
err = Console(stderr=True, highlight=False, emoji=False)


class RichProgress:
    """One bar per phase, with the failures so far."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self.bar: Progress | None = None
        self.failed = 0

    def start(self, label: str, total: int) -> None:
        self.failed = 0
        self.bar = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("failed {task.fields[failed]}"),
            TimeElapsedColumn(),
            console=self.console,
            transient=False,
        )
        self.task = self.bar.add_task(label, total=total, failed=0)
        self.bar.start()

    def advance(self, result: RequestResult) -> None:
        self.failed += not result.ok
        if self.bar is not None:
            failed = f"[red]{self.failed}[/]" if self.failed else "0"
            self.bar.update(self.task, advance=1, failed=failed)

    def stop(self) -> None:
        if self.bar is not None:
            self.bar.stop()
            self.bar = None


def parse_ints(text: str, option: str) -> list[int]:
    """`4096,8192` -> [4096, 8192]; anything but positive integers: a one-line error."""
    try:
        values = [int(x) for x in text.replace(" ", "").split(",") if x]
    except ValueError:
        values = []
    if not values or min(values) < 1:
        raise UcmctlError.one(
            f"'{text}' is not a list of positive integers", key=option, fix="e.g. 4096,8192"
        )
    return values


def parse_trace_rate(text: str, key: str) -> float | None:
    """A synthetic trace's request rate: None for inf (every request at 0), else requests/s > 0.
    (`--request-rate`, a list that sweeps, is `sweep.parse_rates`.)"""
    if text.strip().lower() in ("inf", "infinity"):
        return None
    try:
        rate = float(text)
    except ValueError:
        rate = -1.0
    if not (rate > 0 and math.isfinite(rate)):
        raise UcmctlError.one(f"'{text}' is not a request rate", key=key, fix="inf or requests/s > 0")
    return rate


def cache_salt_of(value: str | None) -> str | None:
    """The run's cache salt: one of its own unless given; `off`: none (a server that rejects
    the field). As vLLM checks it: 1 to 128 characters, none of @ / \\ or NUL."""
    import secrets

    if value is None:
        return f"ucmctl-{secrets.token_hex(8)}"
    if value.strip().lower() == "off":
        return None
    if not 1 <= len(value) <= 128 or any(c in "@/\\\0" for c in value):
        raise UcmctlError.one(
            "a cache salt is 1 to 128 characters, none of @ / \\ or NUL (vLLM's rule)", key="--cache-salt"
        )
    return value


def spread_option_values(argv: list[str], option: str = "--goodput") -> list[str]:
    """`--goodput ttft:500 tpot:50` (vllm bench serve's form, one flag and several values) as
    click reads it: `--goodput ttft:500 --goodput tpot:50`. Values are NAME:NUMBER words."""
    out: list[str] = []
    taking = False
    for arg in argv:
        if arg == option:
            taking = True
            out.append(arg)
            continue
        if taking and not arg.startswith("-") and ":" in arg:
            if out[-1] != option:
                out.append(option)
            out.append(arg)
            continue
        taking = False
        out.append(arg)
    return out


def checked_history(option: str | None) -> Path | None:
    """The results history a run appends to, checked before anything is sent."""
    from ucmctl.bench import history

    path = history.resolve(option)
    if path is not None:
        history.check(path)
    return path


def check_capacity(workload: WorkloadSpec, cfg: Any, target: Any, concurrency: int) -> list[dict[str, Any]]:
    """Read every instance's KV capacity; warn in one line when the workload would overflow
    decode's; the servers' block size becomes the ideal hit rates' granularity."""
    from ucmctl.bench.capacity import capacity_warning, read_capacities
    from ucmctl.bench.client import session

    async def read() -> Any:
        async with session(4, 60) as http:
            return await read_capacities(http, target.instances, target.metrics)

    capacities = loop.run(read())
    sizes = [c.block_size for c in capacities if c.block_size]
    if sizes:
        cfg.block_size = sizes[0]
    in_flight = workload.in_flight_tokens(cfg, concurrency)
    warning = capacity_warning(capacities, in_flight) if in_flight is not None else None
    if warning:
        err.print(warning, style="yellow", markup=False, soft_wrap=True)
    return [
        {
            "instance": c.instance,
            "role": c.role,
            "blocks": c.blocks,
            "block_size": c.block_size,
            "tokens": c.tokens,
        }
        for c in capacities
    ]


@contextlib.contextmanager
def watching(record: Any, target: Any) -> Iterator[None]:
    """The deployment's processes watched while the phases run (nothing to watch with --url)."""
    if record is None:
        yield
        return
    from ucmctl.deploy.watch import Watch

    def say(line: str) -> None:
        err.print(f"[bold red]{escape(line)}[/]" if line.startswith("LOST") else escape(line), soft_wrap=True)

    with Watch(record, say) as watch:
        target.watch = watch
        yield


def write_outputs(
    cells: list[Cell],
    doc: dict[str, Any],
    save: Path | None,
    csv: Path | None,
    md: Path | None,
    plot: Path | None,
    sweep: bool = False,
) -> None:
    """--save, --csv, --markdown and --plot, each file named on stderr as it is written."""
    from ucmctl.bench import report

    if save:
        report.save_json(doc, save)
        err.print(f"wrote {save}")
    if csv:
        report.save_csv(cells, csv)
        err.print(f"wrote {csv}")
    if md:
        md.parent.mkdir(parents=True, exist_ok=True)
        md.write_text(report.markdown(cells))
        err.print(f"wrote {md}")
    if plot:
        _write_plots(cells, plot, sweep)


def _write_plots(cells: list[Cell], plot: Path, sweep: bool) -> None:
    from ucmctl.bench import report
    from ucmctl.bench.series_plot import save_series_plots

    report.save_plot(cells, plot)
    err.print(f"wrote {plot}")
    series = save_series_plots(cells, plot)
    if series:
        err.print(f"wrote {len(series)} time-series figure(s): {series[0].name} ...", markup=False)
    if sweep:
        from ucmctl.bench.capacity_plot import save_capacity_plot

        capacity = plot.with_name(f"{plot.stem}-capacity{plot.suffix or '.png'}")
        rows = [
            {**c.measure.document(), "label": c.label}
            for c in cells
            if c.primary and c.measure is not None and c.measure.given()
        ]
        save_capacity_plot(rows, capacity, title="throughput vs latency per sweep point")
        err.print(f"wrote {capacity}")


def record_run(
    path: Path | None, doc: dict[str, Any], command: str, deployment: str | None, label: str | None
) -> None:
    """The run appended to the results history (none: not recorded)."""
    from ucmctl.bench import history
    from ucmctl.bench.report import finite

    if path is not None:  # as --save writes it (NaN as null): `compare` knows it for the same result
        run_id = history.record(path, finite(doc), command=command, deployment=deployment, label=label)
        err.print(f"recorded as run #{run_id} in {path}", markup=False, highlight=False)


def fail_on_errors(cells: Sequence[Cell | dict[str, Any]]) -> None:
    """Exit with REQUESTS_FAILED when a request failed (its figures are printed and saved)."""
    from ucmctl.bench.results import cells_of

    counted = [c for c in cells_of(cells) if not c.aggregate]  # an aggregate repeats its cells' requests
    failed = sum(p.failed for c in counted for _, p in c.phases())
    if failed:
        raise UcmctlError.one(
            f"{failed} request(s) failed (counted above, excluded from the figures)",
            status=ExitStatus.REQUESTS_FAILED,
        )
