"""`ucmctl bench compare`: the regression gate, against a baseline or the results history."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import typer

from ucmctl.bench.commands.common import out
from ucmctl.core.errors import ExitStatus, UcmctlError

if TYPE_CHECKING:
    from ucmctl.bench.compare import Docs


MAX_REGRESSION = typer.Option(
    None,
    "--max-regression",
    help="limits, e.g. ttft_p50=5%,tpot_mean=3% (default "
    "ttft_mean, tpot_mean, e2el_mean and output_throughput "
    "at 10%)",
)
ALLOW_LOST = typer.Option(
    False,
    "--allow-lost",
    help="gate also on phases that lost a process of the deployment (or had --fault)",
)
VARY = typer.Option(
    None,
    "--vary",
    help="the one parameter of the provenance the sides may differ in, e.g. engine, torch, "
    "topology, input_lens (any other difference is refused)",
)
LAST = typer.Option(
    5,
    "--last",
    min=2,
    help="with one result: the last N runs of the history of its setup are the baseline",
)
BASELINE_LABEL = typer.Option(
    None,
    "--baseline-label",
    help="with one result: only the history's runs given this --label, e.g. main",
)


def compare(
    baseline: Path = typer.Argument(
        ...,
        help="saved result, or a folder of repeated results (alone: the new one, against the history)",
        show_default=False,
    ),
    new: Path | None = typer.Argument(
        None, help="saved result, or a folder of repeated results", show_default=False
    ),
    max_regression: str | None = MAX_REGRESSION,
    repeats: int = typer.Option(
        1, "--repeats", min=1, help="samples each cell must have on each side (judged by mean and 95% CI)"
    ),
    summary: Path | None = typer.Option(None, "--markdown", help="also write the Markdown summary here"),
    junit_path: Path | None = typer.Option(None, "--junit", help="JUnit XML for CI"),
    allow_lost: bool = ALLOW_LOST,
    vary: str | None = VARY,
    last: int = LAST,
    history_file: str | None = typer.Option(
        None, "--history", help="the history (default $UCMCTL_HISTORY, else ~/.ucmctl/history.sqlite)"
    ),
    baseline_label: str | None = BASELINE_LABEL,
) -> None:
    """Exit 0 within limits, 5 on a regression, 2 on bad input; prints a Markdown summary. With
    one result, its baseline is the last --last runs of the results history with its provenance
    key (the same setup), and one new run is judged against their spread."""
    from ucmctl.bench import compare as cmp

    if junit_path is not None and not junit_path.parent.is_dir():
        raise UcmctlError.one(
            "the folder does not exist",
            file=str(junit_path.parent),
            key="--junit",
            fix="create it, or name a file in a folder that exists",
        )
    limits = cmp.parse_limits(max_regression or cmp.DEFAULT_LIMITS)
    if new is None:
        base_docs, new_docs, against = _history_sides(
            baseline, history_file, last, allow_lost, baseline_label
        )
    else:
        base_docs, new_docs = cmp.load_docs(baseline), cmp.load_docs(new)
        against = str(baseline)
    varied = cmp.check_provenance(base_docs, new_docs, vary)
    sides = cmp.cells_of(base_docs, allow_lost), cmp.cells_of(new_docs, allow_lost)
    verdicts = cmp.compare(*sides, limits, repeats)
    head = f"baseline: {against}"
    if varied:
        head += "; varied: " + "; ".join(", ".join(d) for d in varied.values())
    text = cmp.markdown(verdicts, head)
    out.print(text, markup=False)
    if summary:
        summary.parent.mkdir(parents=True, exist_ok=True)
        summary.write_text(text)
    if junit_path:
        cmp.junit(verdicts, junit_path)
    bad = [v for v in verdicts if v.regression]
    if bad:
        names = ", ".join(f"{v.cell} {v.limit.name} {100 * v.change:+.1f}%" for v in bad)
        raise UcmctlError.one(f"regression: {names}", status=ExitStatus.REGRESSION)


def _history_sides(
    new: Path, history_file: str | None, last: int, allow_lost: bool, label: str | None
) -> tuple[Docs, Docs, str]:
    """(baseline, new, what the baseline is): one result against the last runs of the history
    with its provenance key."""
    from ucmctl.bench import compare as cmp
    from ucmctl.bench import history

    path = history.resolve(history_file) or history.default_path()
    new_docs = cmp.load_docs(new)
    base_docs, ids, key = cmp.history_baseline(path, new_docs, last, allow_lost, label)
    return base_docs, new_docs, f"runs {', '.join(f'#{i}' for i in ids)} of {path} (provenance key {key[:8]})"
