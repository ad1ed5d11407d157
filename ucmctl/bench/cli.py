"""`ucmctl bench` (run, the default) and its `suite`, `compare` and `history` commands."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from ucmctl.bench import loop
from ucmctl.bench.history import METRICS as METRIC_NAMES
from ucmctl.bench.workload_defaults import LONG_DOC, MULTI_TURN, TRACE
from ucmctl.core.errors import ExitStatus, UcmctlError

if TYPE_CHECKING:
    from ucmctl.bench.client import RequestResult
    from ucmctl.bench.fault import FaultSpec
    from ucmctl.bench.workloads import WorkloadSpec

app = typer.Typer(
    rich_markup_mode=None,
    help="Preseed-and-measure benchmarks, scenario suites and a regression gate.",
    short_help="Benchmarks, suites, the results history and the gate",
)
SALT_HELP = ("vLLM's cache_salt in every request (default: one of this run's own, so no block of an "
             "earlier run is a hit; a value reuses its blocks on purpose; off: none)")  # fmt: skip
HISTORY_HELP = ("results history this run is appended to (default $UCMCTL_HISTORY, else "
                "~/.ucmctl/history.sqlite; off: none)")  # fmt: skip
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


def _ints(text: str, option: str) -> list[int]:
    try:
        values = [int(x) for x in text.replace(" ", "").split(",") if x]
    except ValueError:
        values = []
    if not values or min(values) < 1:
        raise UcmctlError.one(
            f"'{text}' is not a list of positive integers", key=option, fix="e.g. 4096,8192"
        )
    return values


def _rate(text: str, key: str = "--request-rate") -> float:
    if text.strip().lower() in ("inf", "infinity"):
        return math.inf
    try:
        rate = float(text)
    except ValueError:
        rate = -1.0
    if not (rate > 0 and math.isfinite(rate)):
        raise UcmctlError.one(f"'{text}' is not a request rate", key=key, fix="inf or requests/s > 0")
    return rate


def _write_outputs(
    cells: list[dict[str, Any]],
    doc: dict[str, Any],
    save: Path | None,
    csv: Path | None,
    md: Path | None,
    plot: Path | None,
    sweep: bool = False,
) -> None:
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
                {**c["measure"], "label": c["label"]} for c in cells if c.get("primary") and c.get("measure")
            ]
            save_capacity_plot(rows, capacity, title="throughput vs latency per sweep point")
            err.print(f"wrote {capacity}")


def _history(option: str | None) -> Path | None:
    """The results history a run appends to, checked before anything is sent."""
    from ucmctl.bench import history

    path = history.resolve(option)
    if path is not None:
        history.check(path)
    return path


def _record(
    path: Path | None, doc: dict[str, Any], command: str, deployment: str | None, label: str | None
) -> None:
    from ucmctl.bench import history
    from ucmctl.bench.report import finite

    if path is not None:  # as --save writes it (NaN as null): `compare` knows it for the same result
        run_id = history.record(path, finite(doc), command=command, deployment=deployment, label=label)
        err.print(f"recorded as run #{run_id} in {path}", markup=False, highlight=False)


def _fail_on_errors(cells: list[dict[str, Any]]) -> None:
    counted = [c for c in cells if not c.get("aggregate")]  # an aggregate repeats its cells' requests
    failed = sum((c.get(p) or {}).get("failed", 0) for c in counted for p in ("preseed", "measure"))
    if failed:
        raise UcmctlError.one(
            f"{failed} request(s) failed (counted above, excluded from the figures)",
            status=ExitStatus.REQUESTS_FAILED,
        )


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


DEFAULT_INPUT_LEN = 4096
DEFAULT_VOCAB = 8000


def _default_input_len(max_model_len: int | None, output_len: int) -> int:
    """4096 tokens, or what the server's context leaves after --output-len (whole 256s)."""
    if max_model_len is None or DEFAULT_INPUT_LEN + output_len <= max_model_len:
        return DEFAULT_INPUT_LEN
    room = (max_model_len - output_len) // 256 * 256
    if room < 256:
        raise UcmctlError.one(
            f"--output-len {output_len} leaves no room for a prompt in the server's max_model_len "
            f"{max_model_len}",
            key="--output-len",
            fix="pass a smaller --output-len",
        )
    return room


def _vocabulary(model_dir: Path | None, vocab: int | None, folders: list[str | None]) -> tuple[int, bool]:
    """(ids to draw below, known to be right): --model-dir, else --vocab, else the first of
    `folders` (the deployment's model, the server's /v1/models root) this machine can read, else
    the default, which the caller checks against the server."""
    from ucmctl.bench.prompts import vocab_from_model

    if model_dir is not None:
        if not model_dir.is_dir():
            raise UcmctlError.one("no such folder", key="--model-dir", file=str(model_dir))
        return vocab_from_model(model_dir), True
    if vocab is not None:
        return vocab, False
    for folder in folders:
        if folder and any((Path(folder) / f).is_file() for f in ("config.json", "tokenizer.json")):
            size = vocab_from_model(Path(folder))
            err.print(f"vocabulary {size} ids, from {escape(folder)}", soft_wrap=True)
            return size, True
    return DEFAULT_VOCAB, False


@app.callback(invoke_without_command=True)
def run(
    ctx: typer.Context,
    deployment: str | None = typer.Option(
        None, "--deployment", "-d", help="a deployment started by `ucmctl up`"
    ),
    url: str | None = typer.Option(
        None, "--url", help="any OpenAI-compatible server, e.g. http://127.0.0.1:8000"
    ),
    metrics_url: list[str] = typer.Option(
        [],
        "--metrics-url",
        help="with --url: servers whose /metrics give the hit rate (repeatable; default: the --url itself)",
    ),
    workload: str = typer.Option(
        "prefix",
        "--workload",
        "-w",
        help="prefix (preseed then measure), multi-turn, trace (--trace FILE) or long-doc",
    ),
    input_len: str | None = typer.Option(
        None,
        "--input-len",
        help=f"prefix: measured prompt lengths, e.g. 4096,8192 (default {DEFAULT_INPUT_LEN}, less where "
        "the server's max_model_len leaves no room for --output-len)",
    ),
    prefix_ratio: float = typer.Option(
        0.8,
        "--prefix-ratio",
        min=0.0,
        max=0.999,
        help="prefix: preseed length / input length (0: no preseed)",
    ),
    num_prompts: int = typer.Option(128, "--num-prompts", min=1, help="prefix: prompts per phase"),
    concurrency: str | None = typer.Option(
        None,
        "--concurrency",
        help="requests in flight at most; a list sweeps, e.g. 1,4,16 (default: prefix 128, "
        "multi-turn one per user, long-doc 8, trace 1024)",
    ),
    output_len: int | None = typer.Option(
        None,
        "--output-len",
        min=1,
        help="output tokens (prefix 1000, multi-turn: each answer, 128; long-doc: each query, 100; "
        "trace: the trace's own)",
    ),
    request_rate: str = typer.Option(
        "inf", "--request-rate", help="inf (all at once) or requests/s (Poisson); a list sweeps, e.g. 1,2,4"
    ),
    goodput: list[str] = typer.Option(
        [],
        "--goodput",
        help="SLOs for goodput, as vllm bench serve: --goodput ttft:500 tpot:50 e2el:20000 (ms)",
    ),
    users: int = typer.Option(MULTI_TURN.users, "--users", min=1, help="multi-turn: users (conversations)"),
    rounds: int = typer.Option(MULTI_TURN.rounds, "--rounds", min=1, help="multi-turn: rounds per user"),
    system_tokens: int = typer.Option(
        MULTI_TURN.system_tokens,
        "--system-tokens",
        min=0,
        help="multi-turn: the system prompt every user shares",
    ),
    question_tokens: int = typer.Option(
        MULTI_TURN.question_tokens,
        "--question-tokens",
        min=1,
        help="multi-turn: each new question",
    ),
    trace: Path | None = typer.Option(
        TRACE.trace,
        "--trace",
        help="trace: a JSONL trace in Mooncake's format (docs/trace-format.md)",
    ),
    speedup: float = typer.Option(
        TRACE.speedup, "--speedup", help="trace: replay X times faster than its timestamps"
    ),
    back_to_back: bool = typer.Option(
        False, "--back-to-back", help="trace: ignore the timestamps, keep --concurrency requests in flight"
    ),
    documents: int = typer.Option(LONG_DOC.documents, "--documents", min=1, help="long-doc: documents"),
    doc_tokens: int = typer.Option(
        LONG_DOC.doc_tokens, "--doc-tokens", min=1, help="long-doc: tokens per document"
    ),
    repeat_count: int = typer.Option(
        LONG_DOC.repeat_count, "--repeat-count", min=1, help="long-doc: times each is queried"
    ),
    repeat_mode: str = typer.Option(
        LONG_DOC.repeat_mode, "--repeat-mode", help="long-doc: random, tile or interleave"
    ),
    ignore_eos: bool = typer.Option(
        True, "--ignore-eos/--no-ignore-eos", help="always generate --output-len"
    ),
    seed: int = typer.Option(0, "--seed", min=0, help="prompts of different seeds share no prefix"),
    reset_hbm: bool = typer.Option(
        False,
        "--reset-hbm",
        help="prefix: clear every instance's local prefix cache between the phases "
        "(real vLLM: needs VLLM_SERVER_DEV_MODE=1)",
    ),
    repeats: int = typer.Option(1, "--repeats", min=1, help="prefix: run everything N times (fresh prompts)"),
    model: str | None = typer.Option(None, "--model", help="served model name (default: /v1/models' first)"),
    model_dir: Path | None = typer.Option(
        None, "--model-dir", help="model folder: its vocabulary bounds the ids"
    ),
    vocab: int | None = typer.Option(
        None,
        "--vocab",
        min=256,
        help="token ids are drawn below this (default: from the model folder of the deployment or "
        f"of the server's /v1/models when this machine can read it, else {DEFAULT_VOCAB}, checked "
        "with one request)",
    ),
    temperature: float | None = typer.Option(None, "--temperature", help="sent when given"),
    settle: float = typer.Option(0.0, "--settle", min=0.0, help="seconds to wait between the phases"),
    endpoint: str = typer.Option("/v1/completions", "--endpoint"),
    timeout: float = typer.Option(6 * 3600, "--timeout", help="seconds one request may take"),
    save: Path | None = typer.Option(None, "--save", help="JSON result (vllm bench serve's key names)"),
    csv: Path | None = typer.Option(None, "--csv"),
    markdown: Path | None = typer.Option(None, "--markdown"),
    plot: Path | None = typer.Option(
        None, "--plot", help="PNG of TTFT and E2EL by cell; with a sweep also NAME-capacity.png"
    ),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="no progress bars"),
    fail_fast: bool = typer.Option(
        False, "--fail-fast", help="stop at once when a process of the deployment dies or turns unhealthy"
    ),
    fault: str | None = typer.Option(
        None,
        "--fault",
        help="ACTION:PROCESS@TIME, e.g. kill:decode-0@30s: SIGKILL (kill) or SIGTERM (stop) to a "
        "process of the deployment that far into the first measure phase, and what it cost",
    ),
    cache_salt: str | None = typer.Option(None, "--cache-salt", help=SALT_HELP),
    history_file: str | None = typer.Option(None, "--history", help=HISTORY_HELP),
    label: str | None = typer.Option(None, "--label", help="this run's name in the history, e.g. nightly"),
    sample_interval: float = typer.Option(
        1.0,
        "--sample-interval",
        min=0.0,
        help="seconds between two reads of every instance's /metrics in a phase, kept in the result "
        "(0: none)",
    ),
) -> None:
    """Send a workload (default: the guides' preseed then measure) and print its figures; without
    a subcommand this is what runs. Against a deployment, every process is watched meanwhile: one
    that dies or turns unhealthy is reported within seconds and recorded in the result."""
    if ctx.invoked_subcommand is not None:
        return
    from ucmctl.bench import report
    from ucmctl.bench.goodput import parse_goodput
    from ucmctl.bench.hitrate import Instance
    from ucmctl.bench.runner import (
        BenchConfig,
        Target,
        model_path_of,
        server_facts,
        strip_private,
        target_from_deployment,
        vocabulary_refused,
    )
    from ucmctl.bench.sweep import parse_concurrencies, parse_rates, points, run_points

    # Everything the user typed is checked before anything is sent.
    spec = _spec(workload, ctx.params)
    slos = parse_goodput(goodput) if goodput else {}
    rates = parse_rates(request_rate)
    concurrencies = parse_concurrencies(concurrency) if concurrency else [spec.default_concurrency()]
    if workload == "trace" and rates != [math.inf]:
        raise UcmctlError.one(
            "a trace is sent on its own timestamps",
            key="--request-rate",
            fix="use --speedup or --back-to-back",
        )
    if deployment is not None and url is not None:
        raise UcmctlError.one("--deployment and --url both given", fix="pass one of them")
    fault_spec = _fault_spec(fault, workload, url, rates, num_prompts)
    if plot:
        report.check_plot_available()
    history_path = _history(history_file)
    digest = topo_path = None
    model_path = None
    record = None
    if url is None:
        from ucmctl.deploy.inspect import the_deployment
        from ucmctl.deploy.state import StateStore

        if deployment is None:
            deployment = the_deployment("bench", alternative="or pass --url")
        target = target_from_deployment(deployment)
        record = StateStore().load(deployment)
        if record is not None:
            digest, topo_path = record.topology_digest, record.topology_path
            model_path = model_path_of(record.plan)
            if fault_spec is not None:
                from ucmctl.deploy.fault import process_named

                process_named(record, fault_spec.process)  # before anything is sent
    else:
        if fail_fast:
            raise UcmctlError.one(
                "--fail-fast watches a deployment's processes; with --url there are none to watch",
                key="--fail-fast",
                fix="bench a deployment (-d NAME), or drop --fail-fast",
            )
        base = url.rstrip("/")
        if not base.startswith(("http://", "https://")):
            raise UcmctlError.one(
                f"'{url}' is not an http(s) URL", key="--url", fix="e.g. http://127.0.0.1:8000"
            )
        urls = metrics_url or [base]
        target = Target(
            base,
            [
                Instance(f"server{i}" if len(urls) > 1 else "server", "server", u.rstrip("/"))
                for i, u in enumerate(urls)
            ],
        )
    facts = loop.run(server_facts([target.url, *(i.url for i in target.instances)]))
    if model is None:
        model = facts.model
    out_len = output_len or spec.default_output_len
    input_lens: list[int] = []
    if workload == "prefix":
        if input_len is not None:
            input_lens = _ints(input_len, "--input-len")
        else:
            input_lens = [_default_input_len(facts.max_model_len, out_len)]
            err.print(
                f"input length {input_lens[0]} tokens (the default; --input-len to choose)", soft_wrap=True
            )
    elif input_len is not None:
        raise UcmctlError.one(f"--input-len is for the prefix workload, not {workload}", key="--input-len")
    spec.check(out_len, facts.max_model_len)
    vocab, checked = _vocabulary(model_dir, vocab, [model_path, facts.root])
    if not checked:
        refused = loop.run(vocabulary_refused(target.url + endpoint, vocab, model))
        if refused is not None:
            raise UcmctlError.one(
                f"the server refuses token id {vocab - 1} ({refused}): its vocabulary is smaller "
                f"than the {vocab} ids this benchmark would draw",
                fix="pass --model-dir MODEL_FOLDER (read on this machine) or a smaller --vocab",
            )
    target.endpoint = endpoint
    cfg = BenchConfig(
        input_lens=input_lens,
        prefix_ratio=prefix_ratio,
        num_prompts=num_prompts,
        concurrency=concurrencies[0],
        output_len=out_len,
        request_rate=rates[0],
        ignore_eos=ignore_eos,
        seed=seed,
        reset_hbm=reset_hbm,
        repeats=repeats,
        vocab=vocab,
        model=model,
        temperature=temperature,
        settle_s=settle,
        timeout_s=timeout,
        goodput=slos,
        fail_fast=fail_fast,
        cache_salt=_salt(cache_salt),
        sample_interval_s=sample_interval,
    )
    capacity = _check_capacity(spec, cfg, target, max(concurrencies))
    progress = None if quiet else RichProgress(err)
    sweep = points(rates, concurrencies)
    with _watching(record, target), _faulting(record, fault_spec, target):
        cells = strip_private(loop.run(run_points(spec, cfg, sweep, target, progress, err.print)))
    report.print_cells(cells, out)
    target_info = {
        "url": target.url,
        "deployment": deployment,
        "instances": [i.__dict__ for i in target.instances],
        "kv_capacity": capacity,
    }
    prov = report.provenance(digest, topo_path)
    prov["prompts_digest"] = report.prompts_digest(cells)
    prov["cache_salt"] = cfg.cache_salt
    prov.update(report.deployment_facts(record, model, None if record else target.url))
    config = {**cfg.as_dict(), **spec.describe(cfg), "sweep": [p.as_dict() for p in sweep]}
    doc = report.document(cells, config, prov, target_info)
    _write_outputs(cells, doc, save, csv, markdown, plot, sweep=len(sweep) > 1)
    _record(history_path, doc, "bench", deployment, label)
    _save_log_tails(target, save)
    _fault_not_injected(cells)
    _fail_on_errors(cells)


def _fault_spec(
    text: str | None, workload: str, url: str | None, rates: list[float], num_prompts: int
) -> FaultSpec | None:
    """--fault parsed and checked against the run before anything is sent (exit 2)."""
    if text is None:
        return None
    from ucmctl.bench.fault import parse_fault

    spec = parse_fault(text)
    if url is not None:
        raise UcmctlError.one("--fault signals a process of a deployment; with --url there is none",
                              key="--fault", fix="bench a deployment (-d NAME)")  # fmt: skip
    if workload != "prefix":
        raise UcmctlError.one(f"--fault is for the prefix workload, not {workload}", key="--fault")
    if not math.isinf(rates[0]) and spec.at_s >= num_prompts / rates[0]:
        raise UcmctlError.one(
            f"'{text}': the measure phase sends its {num_prompts} requests within about "
            f"{num_prompts / rates[0]:.0f} s at {rates[0]:g}/s, before {spec.at_s:g} s",
            key="--fault",
            fix="pick an earlier time, or more --num-prompts",
        )
    return spec


@contextlib.contextmanager
def _faulting(record: Any, spec: FaultSpec | None, target: Any) -> Iterator[None]:
    """The fault armed for the first measure phase, its node reached beforehand."""
    if spec is None:
        yield
        return
    from ucmctl.bench.fault import ALL, Fault
    from ucmctl.deploy.fault import process_named, signaller

    victim = process_named(record, spec.process)
    with signaller(record, victim, spec.action) as fire:
        proxy = target.url if any(p.role == "proxy" for p in record.plan.processes) else None
        victim_url = victim.url.rstrip("/") if victim.is_server and victim.url else None
        if victim.role == "proxy":
            victim_url = ALL  # its gauges are read for every instance, and it has no store
        target.fault = Fault(spec, fire, proxy_url=proxy, victim_url=victim_url, watch=target.watch)
        yield


def _fault_not_injected(cells: list[dict[str, Any]]) -> None:
    """A fault whose time came after its phase ended: one line, exit 2 (its figures are saved)."""
    for cell in cells:
        f = (cell.get("measure") or {}).get("fault")
        if f and not f.get("injected"):
            raise UcmctlError.one(
                f"--fault {f['spec']} was not injected: {f.get('why')}",
                key="--fault",
                fix="pick an earlier time, a lower --request-rate or more --num-prompts",
            )


def _salt(value: str | None) -> str | None:
    """The run's cache salt: one of its own unless given; `off`: none (a server that rejects
    the field). As vLLM checks it: 1 to 128 characters, none of @ / \\ or NUL."""
    import secrets

    if value is None:
        return f"ucmctl-{secrets.token_hex(8)}"
    if value.strip().lower() == "off":
        return None
    if not 1 <= len(value) <= 128 or any(c in "@/\\\0" for c in value):
        raise UcmctlError.one("a cache salt is 1 to 128 characters, none of @ / \\ or NUL (vLLM's rule)",
                              key="--cache-salt")  # fmt: skip
    return value


@contextlib.contextmanager
def _watching(record: Any, target: Any) -> Iterator[None]:
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


def _save_log_tails(target: Any, save: Path | None) -> None:
    """The last log lines of each process lost, beside the saved result: RESULT.lost-PROCESS.log."""
    watch = getattr(target, "watch", None)
    if watch is None or save is None:
        return
    for loss in watch.losses:
        path = save.with_name(f"{save.stem}.lost-{loss.process}.log")
        path.write_text(f"# {loss.line()}\n{loss.log_tail}")
        err.print(f"its last log lines: {path}", soft_wrap=True)


app.command(
    "run",
    help="Send a workload and print its figures (also `ucmctl bench` alone).",
    short_help="Send a workload and print its figures",
)(run)


def _spec(kind: str, options: dict[str, Any]) -> WorkloadSpec:
    """The workload as typed: the spec a suite parses, from the options named as its fields, its
    file (a trace) read and checked before anything is sent. Typer has checked the options'
    ranges; the spec's `load` checks the rest under the options' names (pydantic's validation,
    whose messages name suite keys, is skipped)."""
    from ucmctl.bench.workloads import BY_KIND  # the specs load pydantic: not at start-up

    spec_class = BY_KIND.get(kind)
    if spec_class is None:
        raise UcmctlError.one(
            f"unknown workload '{kind}'", key="--workload", fix=f"use one of {', '.join(BY_KIND)}"
        )
    if kind != "trace" and options["trace"] is not None:
        raise UcmctlError.one(
            f"--trace is for the trace workload, not {kind}", key="--trace", fix="add --workload trace"
        )
    if kind == "trace" and options["trace"] is None:
        raise UcmctlError.one("the trace workload needs a trace", key="--trace", fix="--trace FILE.jsonl "
                              "(`ucmctl bench make-trace` writes one)")  # fmt: skip
    values = {
        **options,
        "trace": None if options["trace"] is None else str(options["trace"]),
        "speedup": None if options["back_to_back"] else options["speedup"],
    }
    spec = spec_class.model_construct(**{f: values[f] for f in spec_class.model_fields if f != "kind"})
    spec.load(Path())
    return spec


def _check_capacity(workload: WorkloadSpec, cfg: Any, target: Any, concurrency: int) -> list[dict[str, Any]]:
    """Read every instance's KV capacity; warn in one line when the workload would overflow
    decode's; the servers' block size becomes the ideal hit rates' granularity."""
    from ucmctl.bench.capacity import capacity_warning, read_capacities
    from ucmctl.bench.client import session

    async def read() -> Any:
        async with session(4, 60) as http:
            return await read_capacities(http, target.instances)

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


@app.command("make-trace", short_help="Write a synthetic trace in Mooncake's format")
def make_trace(
    path: Path = typer.Argument(..., help="the JSONL trace to write", show_default=False),
    requests: int = typer.Option(200, "--requests", help="requests in the trace"),
    rate: str = typer.Option("2", "--rate", help="requests/s (Poisson timestamps), or inf: all at 0"),
    input_len: int = typer.Option(4096, "--input-len", help="mean prompt length (tokens)"),
    output_len: int = typer.Option(128, "--output-len", help="mean output length (tokens)"),
    pattern: str = typer.Option(
        "shared-prefix", "--pattern", help="shared-prefix, sessions (growing conversations) or unique"
    ),
    groups: int = typer.Option(8, "--groups", help="shared-prefix: prefix groups; sessions: sessions"),
    shared_fraction: float = typer.Option(
        0.5,
        "--shared-fraction",
        help="shared-prefix: share of a prompt from its group; sessions: of the context",
    ),
    seed: int = typer.Option(0, "--seed", min=0),
) -> None:
    """Write a synthetic trace in Mooncake's format with a chosen reuse pattern, and print its
    ideal hit ratio (docs/trace-format.md)."""
    from ucmctl.bench import trace

    if pattern not in ("shared-prefix", "sessions", "unique"):
        raise UcmctlError.one(
            f"unknown pattern '{pattern}'", key="--pattern", fix="use shared-prefix, sessions or unique"
        )
    per_s = None if rate.strip().lower() in ("inf", "infinity") else _rate(rate, "--rate")
    reqs = trace.make_trace(
        requests=requests,
        rate=per_s,
        input_len=input_len,
        output_len=output_len,
        pattern=pattern,  # type: ignore[arg-type]
        groups=groups,
        shared_fraction=shared_fraction,
        seed=seed,
    )
    trace.write_trace(reqs, path)
    ideal = trace.ideal_hits(reqs)
    ratio = "-" if ideal.ratio is None else f"{100 * ideal.ratio:.1f}%"
    span = reqs[-1].timestamp_ms / 1000
    out.print(
        f"wrote {escape(str(path))}: {len(reqs)} requests over {span:.1f} s, "
        f"{ideal.total_tokens:,} prompt tokens, ideal hit ratio {ratio}",
        soft_wrap=True,
    )


@app.command("suite", short_help="Run a matrix of input lengths x scenarios")
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
    from ucmctl.bench import report
    from ucmctl.bench.prompts import vocab_from_model
    from ucmctl.bench.runner import strip_private
    from ucmctl.bench.suite import DeployApi, ResultsFile, load_suite, run_suite
    from ucmctl.topology.load import load_topology

    the_suite = load_suite(path)
    topo_path = (path.parent / the_suite.topology).resolve()
    topology = load_topology(topo_path)
    if plot:
        report.check_plot_available()
    history_path = _history(history_file)
    records: list[Any] = []  # the deployment of the last cell run: where the suite ran
    if vocab is None:
        vocab = the_suite.vocab
    if vocab is None:
        model_dir = Path(topology.model.path)
        vocab = vocab_from_model(model_dir) if (model_dir / "config.json").is_file() else 8000
    results_file = ResultsFile(results or Path("bench-results") / f"{the_suite.name}.jsonl", the_suite)
    results_file.open(fresh)
    err.print(
        f"results: {results_file.path} ({len(results_file.done)} of {len(the_suite.cells())} cells done)"
    )
    progress = None if quiet else RichProgress(err)

    workload = the_suite.spec()
    workload.load(path.parent)  # a trace: relative to the suite file

    def run_cell(cfg: Any, target: Any) -> list[dict[str, Any]]:
        from ucmctl.deploy.state import StateStore

        _check_capacity(workload, cfg, target, cfg.concurrency)
        records[:] = [StateStore().load(topology.name)]
        with _watching(records[0], target):  # as `bench` run: losses in `lost`
            return strip_private(loop.run(workload.run(cfg, target, progress, err.print)))

    salt = _salt(cache_salt)
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
    prov = report.provenance(topology.digest(), str(topo_path))
    prov["prompts_digest"] = report.prompts_digest(cells)
    prov["cache_salt"] = salt
    prov.update(report.deployment_facts(records[0] if records else None, None, None))
    doc = report.document(cells, {**the_suite.model_dump(mode="json"), "vocab": vocab}, prov)
    _write_outputs(cells, doc, save, csv, markdown, plot)
    _record(history_path, doc, "suite", topology.name, label)
    _fail_on_errors(cells)


@app.command("history", short_help="The stored runs, their trends and plots")
def history_command(
    deployment: str | None = typer.Option(None, "--deployment", "-d", help="runs against this deployment"),
    workload: str | None = typer.Option(None, "--workload", "-w", help="prefix, multi-turn, trace, long-doc"),
    label: str | None = typer.Option(None, "--label", help="runs given this --label"),
    since: str | None = typer.Option(None, "--since", help="e.g. 7d, 12h, 2026-12-01"),
    key: str | None = typer.Option(
        None, "--key", help="runs of this provenance key (its first 8+ characters)"
    ),
    last: int = typer.Option(20, "--last", min=1, help="the last N runs that match"),
    cell: str | None = typer.Option(
        None, "--cell", help="trends of the cells matching this glob, e.g. 'ucm/*'"
    ),
    history_file: str | None = typer.Option(
        None, "--history", help="the history file (default $UCMCTL_HISTORY, else ~/.ucmctl/history.sqlite)"
    ),
    plot: Path | None = typer.Option(None, "--plot", help="folder: a trend figure (PNG) per metric"),
    metric: str = typer.Option(
        "ttft_mean,tpot_mean,e2el_mean,output_throughput,hit_rate",
        "--metric",
        help="--plot's metrics, of: " + ", ".join(METRIC_NAMES),
    ),
) -> None:
    """The runs of the results history that match (oldest first), then each cell's trend."""
    from ucmctl.bench import history, history_view

    path = history.resolve(history_file) or history.default_path()
    metrics = [m.strip() for m in metric.split(",") if m.strip()]
    unknown = [m for m in metrics if m not in METRIC_NAMES]
    if unknown or not metrics:
        raise UcmctlError.one(f"unknown metric '{', '.join(unknown)}'", key="--metric",
                              fix="one or more of " + ", ".join(METRIC_NAMES))  # fmt: skip
    if key is not None and len(key) < 8:
        raise UcmctlError.one(
            "a provenance key is 8 or more characters", key="--key", fix="copy it from the list"
        )
    if plot:
        from ucmctl.bench.report import check_plot_available

        check_plot_available()
        if plot.exists() and not plot.is_dir():
            raise UcmctlError.one(
                "is a file, not a folder", file=str(plot), key="--plot", fix="name a folder"
            )
    found = history.runs(
        path,
        history.Filter(
            deployment=deployment,
            workload=workload,
            label=label,
            since=history.parse_since(since) if since else None,
            key=key,
            last=last,
        ),
    )
    if not found:
        said = f"no run in {path} matches" if path.exists() else f"no results history yet at {path}"
        out.print(said, markup=False, highlight=False)
        return
    cells = history_view.by_cell(history.cells(path, [r.id for r in found]), cell)
    history_view.print_runs(found, out)
    history_view.print_trends(found, cells, out)
    if plot:
        for written in history_view.save_trend_plots(found, cells, plot, metrics):
            err.print(f"wrote {written}", markup=False, highlight=False)


@app.command("compare", short_help="Gate results against a baseline or the history")
def compare(
    baseline: Path = typer.Argument(
        ...,
        help="saved result, or a folder of repeated results (alone: the new one, against the history)",
        show_default=False,
    ),
    new: Path | None = typer.Argument(
        None, help="saved result, or a folder of repeated results", show_default=False
    ),
    max_regression: str | None = typer.Option(
        None,
        "--max-regression",
        help="limits, e.g. ttft_p50=5%,tpot_mean=3% (default "
        "ttft_mean, tpot_mean, e2el_mean and output_throughput "
        "at 10%)",
    ),
    repeats: int = typer.Option(
        1, "--repeats", min=1, help="samples each cell must have on each side (judged by mean and 95% CI)"
    ),
    summary: Path | None = typer.Option(None, "--markdown", help="also write the Markdown summary here"),
    junit_path: Path | None = typer.Option(None, "--junit", help="JUnit XML for CI"),
    allow_lost: bool = typer.Option(
        False,
        "--allow-lost",
        help="gate also on phases that lost a process of the deployment (or had --fault)",
    ),
    vary: str | None = typer.Option(
        None,
        "--vary",
        help="the one parameter of the provenance the sides may differ in, e.g. engine, torch, "
        "topology, input_lens (any other difference is refused)",
    ),
    last: int = typer.Option(
        5,
        "--last",
        min=2,
        help="with one result: the last N runs of the history of its setup are the baseline",
    ),
    history_file: str | None = typer.Option(
        None, "--history", help="the history (default $UCMCTL_HISTORY, else ~/.ucmctl/history.sqlite)"
    ),
    baseline_label: str | None = typer.Option(
        None,
        "--baseline-label",
        help="with one result: only the history's runs given this --label, e.g. main",
    ),
) -> None:
    """Exit 0 within limits, 5 on a regression, 2 on bad input; prints a Markdown summary. With
    one result, its baseline is the last --last runs of the results history with its provenance
    key (the same setup), and one new run is judged against their spread."""
    from ucmctl.bench import compare as cmp
    from ucmctl.bench import history

    if junit_path is not None and not junit_path.parent.is_dir():
        raise UcmctlError.one("the folder does not exist", file=str(junit_path.parent), key="--junit",
                              fix="create it, or name a file in a folder that exists")  # fmt: skip
    limits = cmp.parse_limits(max_regression or cmp.DEFAULT_LIMITS)
    if new is None:
        path = history.resolve(history_file) or history.default_path()
        new_docs = cmp.load_docs(baseline)
        base_docs, ids, key = cmp.history_baseline(path, new_docs, last, allow_lost, baseline_label)
        against = f"runs {', '.join(f'#{i}' for i in ids)} of {path} (provenance key {key[:8]})"
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
