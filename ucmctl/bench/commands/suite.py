"""`ucmctl bench suite`: a matrix of input lengths x scenarios, redeployed per scenario, resumed
from its results file."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from ucmctl.bench import loop
from ucmctl.bench.commands.common import (
    HISTORY_HELP,
    SALT_HELP,
    RichProgress,
    cache_salt_of,
    check_capacity,
    checked_history,
    err,
    fail_on_errors,
    out,
    record_run,
    watching,
    write_outputs,
)

if TYPE_CHECKING:
    from ucmctl.bench.results import Cell
    from ucmctl.bench.suite import ResultsFile, Suite
    from ucmctl.bench.workloads import WorkloadSpec


def suite(
    path: Path = typer.Argument(..., help="suite YAML, e.g. benchmarks/suites/ci.yaml", show_default=False),
    results: Path | None = typer.Option(
        None, "--results", help="resume file (default bench-results/<suite name>.jsonl)"
    ),
    fresh: bool = typer.Option(False, "--fresh", help="forget finished cells and start over"),
    vocab: int | None = typer.Option(None, "--vocab", min=256, help="overrides the suite's and the model's"),
    save: Path | None = typer.Option(None, "--save"),
    csv: Path | None = typer.Option(None, "--csv"),
    markdown: Path | None = typer.Option(None, "--markdown"),
    plot: Path | None = typer.Option(None, "--plot"),
    quiet: bool = typer.Option(False, "--quiet", "-q"),
    cache_salt: str | None = typer.Option(None, "--cache-salt", help=SALT_HELP),
    history_file: str | None = typer.Option(None, "--history", help=HISTORY_HELP),
    label: str | None = typer.Option(None, "--label", help="this run's name in the history, e.g. nightly"),
    fail_fast: bool = typer.Option(
        False,
        "--fail-fast",
        help="stop at once when a process of a scenario's deployment dies or turns unhealthy",
    ),
) -> None:
    """Run a matrix of input lengths x scenarios (recompute, hbm, ucm), redeploying per scenario.
    Interrupted? Run it again: finished cells are kept in the results file."""
    from ucmctl.bench import provenance, report
    from ucmctl.bench.suite import DeployApi, load_suite, run_suite
    from ucmctl.topology.load import load_topology

    the_suite = load_suite(path)
    topo_path = (path.parent / the_suite.topology).resolve()
    topology = load_topology(topo_path)
    if plot:
        report.check_plot_available()
    history_path = checked_history(history_file)
    records: list[Any] = []  # the deployment of the last cell run: where the suite ran
    vocab = _vocab(vocab, the_suite.vocab, Path(topology.model.path))
    results_file = _results_file(results, fresh, the_suite)
    progress = None if quiet else RichProgress(err)

    the_suite.spec().load(path.parent)  # a trace: relative to the suite file

    def run_cell(workload: WorkloadSpec, cfg: Any, target: Any) -> list[Cell]:
        from ucmctl.deploy.state import StateStore

        check_capacity(workload, cfg, target, cfg.concurrency)
        records[:] = [StateStore().load(topology.name)]
        with watching(records[0], target):  # as `bench` run: losses in `lost`
            return loop.run(workload.run(cfg, target, progress, err.print))

    salt = cache_salt_of(cache_salt)
    cells = run_suite(
        the_suite,
        topology,
        str(topo_path),
        results_file,
        run_cell,
        DeployApi(),
        vocab,
        err.print,
        cache_salt=salt,
        fail_fast=fail_fast,
    )
    report.print_cells(cells, out)
    out.print(report.markdown(cells))
    prov = provenance.provenance(topology.digest(), str(topo_path))
    prov["prompts_digest"] = provenance.prompts_digest(cells)
    prov["cache_salt"] = salt
    prov.update(provenance.deployment_facts(records[0] if records else None, None, None))
    doc = report.document(cells, {**the_suite.model_dump(mode="json"), "vocab": vocab}, prov)
    write_outputs(cells, doc, save, csv, markdown, plot)
    record_run(history_path, doc, "suite", topology.name, label)
    fail_on_errors(cells)


def _vocab(option: int | None, suites: int | None, model_dir: Path) -> int:
    """--vocab, else the suite's, else the model folder's, else 8000."""
    from ucmctl.bench.prompts import vocab_from_model

    if option is not None:
        return option
    if suites is not None:
        return suites
    return vocab_from_model(model_dir) if (model_dir / "config.json").is_file() else 8000


def _results_file(results: Path | None, fresh: bool, the_suite: Suite) -> ResultsFile:
    """The suite's results file opened (--fresh: emptied), how far it is said on stderr."""
    from ucmctl.bench.suite import ResultsFile

    results_file = ResultsFile(results or Path("bench-results") / f"{the_suite.name}.jsonl", the_suite)
    results_file.open(fresh)
    err.print(
        f"results: {results_file.path} ({len(results_file.done)} of {len(the_suite.cells())} cells done)"
    )
    return results_file
