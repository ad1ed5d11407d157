"""`ucmctl bench` (and `bench run`): send a workload and print its figures, in steps: the
options checked, the target found, the run configured against the server, the workload sent,
the result reported and saved."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from ucmctl.bench import loop
from ucmctl.bench.commands import run_options as o
from ucmctl.bench.commands.common import (
    RichProgress,
    cache_salt_of,
    check_capacity,
    checked_history,
    err,
    fail_on_errors,
    out,
    parse_ints,
    record_run,
    watching,
    write_outputs,
)
from ucmctl.bench.commands.faults import fault_not_injected, fault_spec, faulting, save_log_tails
from ucmctl.bench.commands.run_options import RunOptions
from ucmctl.bench.commands.workload import default_input_len, foreign_option, spec_of, vocabulary
from ucmctl.core.errors import UcmctlError

if TYPE_CHECKING:
    from ucmctl.bench.fault import FaultSpec
    from ucmctl.bench.results import Cell
    from ucmctl.bench.runner import BenchConfig, Target
    from ucmctl.bench.sweep import Point
    from ucmctl.bench.workloads import WorkloadSpec


@o.with_workload_options
def run(
    ctx: typer.Context,
    deployment: str | None = o.DEPLOYMENT,
    url: str | None = o.URL,
    engine: str | None = o.ENGINE,
    metrics_url: list[str] = o.METRICS_URL,
    workload: str = o.WORKLOAD,
    concurrency: str | None = o.CONCURRENCY,
    output_len: int | None = o.OUTPUT_LEN,
    request_rate: str = o.REQUEST_RATE,
    goodput: list[str] = o.GOODPUT,
    ignore_eos: bool = o.IGNORE_EOS,
    seed: int = o.SEED,
    model: str | None = o.MODEL,
    model_dir: Path | None = o.MODEL_DIR,
    vocab: int | None = o.VOCAB,
    temperature: float | None = o.TEMPERATURE,
    settle: float = o.SETTLE,
    endpoint: str = o.ENDPOINT,
    timeout: float = o.TIMEOUT,
    save: Path | None = o.SAVE,
    csv: Path | None = o.CSV,
    markdown: Path | None = o.MARKDOWN,
    plot: Path | None = o.PLOT,
    quiet: bool = o.QUIET,
    fail_fast: bool = o.FAIL_FAST,
    fault: str | None = o.FAULT,
    cache_salt: str | None = o.CACHE_SALT,
    history_file: str | None = o.HISTORY_FILE,
    label: str | None = o.LABEL,
    sample_interval: float = o.SAMPLE_INTERVAL,
    **params: Any,
) -> None:
    """Send a workload (default: the guides' preseed then measure) and print its figures; without
    a subcommand this is what runs. Against a deployment, every process is watched meanwhile: one
    that dies or turns unhealthy is reported within seconds and recorded in the result."""
    if ctx.invoked_subcommand is not None:
        return
    bench(RunOptions.of(locals()))


@dataclass
class Checked:
    """The options that need no server, checked before anything is sent."""

    spec: WorkloadSpec
    slos: dict[str, float]
    rates: list[float]
    concurrencies: list[int]
    fault: FaultSpec | None
    history: Path | None


@dataclass
class Where:
    """Where the run goes: the target, and for a deployment its record and what it says."""

    target: Target
    deployment: str | None = None
    record: Any = None
    digest: str | None = None
    topo_path: str | None = None
    model_path: str | None = None


def bench(opts: RunOptions) -> None:
    """One `ucmctl bench` run, its options as typed."""
    from ucmctl.bench import report
    from ucmctl.bench.sweep import points, run_points

    checked = check_options(opts)
    where = find_target(opts, checked.fault)
    cfg, model = configure(opts, checked, where)
    capacity = check_capacity(checked.spec, cfg, where.target, max(checked.concurrencies))
    progress = None if opts.quiet else RichProgress(err)
    sweep = points(checked.rates, checked.concurrencies)
    with watching(where.record, where.target), faulting(where.record, checked.fault, where.target):
        sent = run_points(checked.spec, cfg, sweep, where.target, progress, err.print)
        cells = loop.run(sent)
    report.print_cells(cells, out)
    doc = document(checked.spec, cfg, model, where, cells, capacity, sweep)
    write_outputs(cells, doc, opts.save, opts.csv, opts.markdown, opts.plot, sweep=len(sweep) > 1)
    record_run(checked.history, doc, "bench", where.deployment, opts.label)
    save_log_tails(where.target, opts.save)
    fault_not_injected(cells)
    fail_on_errors(cells)


def check_options(opts: RunOptions) -> Checked:
    """Everything the user typed that needs no server, checked before anything is sent."""
    from ucmctl.bench import report
    from ucmctl.bench.goodput import parse_goodput
    from ucmctl.bench.sweep import parse_concurrencies, parse_rates

    spec = spec_of(opts.workload, opts.params)
    slos = parse_goodput(opts.goodput) if opts.goodput else {}
    rates = parse_rates(opts.request_rate)
    if opts.concurrency:
        concurrencies = parse_concurrencies(opts.concurrency)
    else:
        concurrencies = [spec.default_concurrency()]
    spec.check_rates(rates)
    if opts.deployment is not None and opts.url is not None:
        raise UcmctlError.one("--deployment and --url both given", fix="pass one of them")
    check_engine(opts)
    fault = fault_spec(opts.fault, spec, opts.url, rates)
    if opts.plot:
        report.check_plot_available()
    return Checked(spec, slos, rates, concurrencies, fault, checked_history(opts.history_file))


def check_engine(opts: RunOptions) -> None:
    """--engine names one of the engines, and only for --url: a deployment's plan names its own."""
    from ucmctl.engines import ENGINES

    if opts.engine is None:
        return
    if opts.url is None:
        raise UcmctlError.one(
            "--engine is for --url: a deployment's plan names its engine", key="--engine", fix="drop it"
        )
    if opts.engine not in ENGINES:
        raise UcmctlError.one(
            f"unknown engine '{opts.engine}'", key="--engine", fix="one of " + ", ".join(ENGINES)
        )


def find_target(opts: RunOptions, fault: FaultSpec | None) -> Where:
    """The deployment's proxy and instances (the only one when none is named), or --url's server."""
    if opts.url is not None:
        return Where(url_target(opts))
    from ucmctl.bench.runner import model_path_of, target_from_deployment
    from ucmctl.deploy.inspect import the_deployment
    from ucmctl.deploy.state import StateStore

    deployment = opts.deployment
    if deployment is None:
        deployment = the_deployment("bench", alternative="or pass --url")
    where = Where(target_from_deployment(deployment), deployment, StateStore().load(deployment))
    if where.record is not None:
        where.target.engine = where.record.plan.engine
        where.digest, where.topo_path = where.record.topology_digest, where.record.topology_path
        where.model_path = model_path_of(where.record.plan)
        if fault is not None:
            from ucmctl.deploy.fault import process_named

            process_named(where.record, fault.process)  # before anything is sent
    return where


def url_target(opts: RunOptions) -> Target:
    """--url's server, its /metrics read at --metrics-url (default: the server itself)."""
    from ucmctl.bench.hitrate import Instance
    from ucmctl.bench.runner import Target
    from ucmctl.engines import DEFAULT_ENGINE

    if opts.fail_fast:
        raise UcmctlError.one(
            "--fail-fast watches a deployment's processes; with --url there are none to watch",
            key="--fail-fast",
            fix="bench a deployment (-d NAME), or drop --fail-fast",
        )
    doors = [u.strip().rstrip("/") for u in (opts.url or "").split(",")]
    for url in doors:
        if not url.startswith(("http://", "https://")) or len(url) <= len("https://"):
            raise UcmctlError.one(
                f"'{url}' is not an http(s) URL",
                key="--url",
                fix="e.g. http://127.0.0.1:8000, or several: http://h1:8000,http://h2:8000",
            )
    urls = opts.metrics_url or doors[:1]
    return Target(
        doors[0],
        [
            Instance(f"server{i}" if len(urls) > 1 else "server", "server", u.rstrip("/"))
            for i, u in enumerate(urls)
        ],
        engine=opts.engine or DEFAULT_ENGINE,
        more_urls=doors[1:],
    )


def configure(opts: RunOptions, checked: Checked, where: Where) -> tuple[BenchConfig, str | None]:
    """The run's config and the served model, from the options and what the server says of
    itself (its model, its context length, its vocabulary)."""
    from ucmctl.bench.runner import BenchConfig, server_facts, vocabulary_refused

    target, spec = where.target, checked.spec
    facts = loop.run(server_facts([*target.urls, *(i.url for i in target.instances)]))  # one dead: the next
    model = facts.model if opts.model is None else opts.model
    out_len = opts.output_len or spec.default_output_len
    fit_input_lengths(opts, spec, facts.max_model_len, out_len)
    spec.check(out_len, facts.max_model_len)
    vocab, known = vocabulary(opts.model_dir, opts.vocab, [where.model_path, facts.root])
    if not known:
        refused = loop.run(vocabulary_refused(target.url + opts.endpoint, vocab, model))
        if refused is not None:
            raise UcmctlError.one(
                f"the server refuses token id {vocab - 1} ({refused}): its vocabulary is smaller "
                f"than the {vocab} ids this benchmark would draw",
                fix="pass --model-dir MODEL_FOLDER (read on this machine) or a smaller --vocab",
            )
    target.endpoint = opts.endpoint
    cfg = BenchConfig(
        concurrency=checked.concurrencies[0],
        output_len=out_len,
        request_rate=checked.rates[0],
        ignore_eos=opts.ignore_eos,
        seed=opts.seed,
        vocab=vocab,
        model=model,
        temperature=opts.temperature,
        settle_s=opts.settle,
        timeout_s=opts.timeout,
        goodput=checked.slos,
        fail_fast=opts.fail_fast,
        cache_salt=cache_salt_of(opts.cache_salt),
        sample_interval_s=opts.sample_interval,
    )
    return cfg, model


def fit_input_lengths(opts: RunOptions, spec: WorkloadSpec, max_model_len: int | None, out_len: int) -> None:
    """The input lengths of a workload that takes --input-len: its values, else the default that
    fits the server's context. Another workload refuses --input-len."""
    given = opts.params["input_len"]
    if "--input-len" not in spec.own_options:
        if given is not None:
            raise foreign_option(spec.kind, "--input-len")
        return
    if given is not None:
        spec.take_input_lens(parse_ints(given, "--input-len"))
        return
    length = default_input_len(max_model_len, out_len)
    spec.take_input_lens([length])
    err.print(f"input length {length} tokens (the default; --input-len to choose)", soft_wrap=True)


def document(
    spec: WorkloadSpec,
    cfg: BenchConfig,
    model: str | None,
    where: Where,
    cells: list[Cell],
    capacity: list[dict[str, Any]],
    sweep: list[Point],
) -> dict[str, Any]:
    """The JSON result: the cells, the config, the provenance and the target."""
    from ucmctl.bench import provenance, report

    target = where.target
    target_info = {
        "url": target.url,
        "deployment": where.deployment,
        "instances": [i.__dict__ for i in target.instances],
        "kv_capacity": capacity,
    }
    prov = provenance.provenance(where.digest, where.topo_path)
    prov["prompts_digest"] = provenance.prompts_digest(cells)
    prov["cache_salt"] = cfg.cache_salt
    prov.update(provenance.deployment_facts(where.record, model, None if where.record else target.url))
    config = {**cfg.as_dict(), **spec.describe(cfg), "sweep": [p.as_dict() for p in sweep]}
    return report.document(cells, config, prov, target_info)
