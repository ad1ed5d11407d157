"""`ucmctl bench` (run, the default), `ucmctl bench suite` and `ucmctl bench compare`."""

from __future__ import annotations

import asyncio
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from ucmctl.errors import ExitStatus, UcmctlError

if TYPE_CHECKING:
    from ucmctl.bench.client import RequestResult

app = typer.Typer(help="Preseed-and-measure benchmarks, scenario suites and a regression gate.")
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


def _rate(text: str) -> float:
    if text.strip().lower() in ("inf", "infinity"):
        return math.inf
    try:
        rate = float(text)
    except ValueError:
        rate = -1.0
    if not rate > 0:
        raise UcmctlError.one(
            f"'{text}' is not a request rate", key="--request-rate", fix="inf or requests/s > 0"
        )
    return rate


def _write_outputs(
    cells: list[dict[str, Any]],
    doc: dict[str, Any],
    save: Path | None,
    csv: Path | None,
    md: Path | None,
    plot: Path | None,
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
        report.save_plot(cells, plot)
        err.print(f"wrote {plot}")


def _fail_on_errors(cells: list[dict[str, Any]]) -> None:
    failed = sum((c.get(p) or {}).get("failed", 0) for c in cells for p in ("preseed", "measure"))
    if failed:
        raise UcmctlError.one(
            f"{failed} request(s) failed (counted above, excluded from the figures)",
            status=ExitStatus.REQUESTS_FAILED,
        )


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
    input_len: str | None = typer.Option(
        None,
        "--input-len",
        help=f"measured prompt lengths, e.g. 4096,8192 (default {DEFAULT_INPUT_LEN}, less where the "
        "server's max_model_len leaves no room for --output-len)",
    ),
    prefix_ratio: float = typer.Option(
        0.8, "--prefix-ratio", min=0.0, max=0.999, help="preseed length / input length (0: no preseed phase)"
    ),
    num_prompts: int = typer.Option(128, "--num-prompts", min=1),
    concurrency: int = typer.Option(128, "--concurrency", min=1, help="requests in flight at most"),
    output_len: int = typer.Option(1000, "--output-len", min=1),
    request_rate: str = typer.Option(
        "inf", "--request-rate", help="inf (all at once) or requests/s (Poisson)"
    ),
    ignore_eos: bool = typer.Option(
        True, "--ignore-eos/--no-ignore-eos", help="always generate --output-len"
    ),
    seed: int = typer.Option(0, "--seed", min=0, help="prompts of different seeds share no prefix"),
    reset_hbm: bool = typer.Option(
        False,
        "--reset-hbm",
        help="clear every instance's local prefix cache between the phases "
        "(real vLLM: needs VLLM_SERVER_DEV_MODE=1)",
    ),
    repeats: int = typer.Option(1, "--repeats", min=1, help="run everything N times (fresh prompts each)"),
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
    plot: Path | None = typer.Option(None, "--plot", help="PNG of TTFT and E2EL by input length"),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="no progress bars"),
) -> None:
    """Preseed then measure, per input length; without a subcommand this is what runs."""
    if ctx.invoked_subcommand is not None:
        return
    from ucmctl.bench import report
    from ucmctl.bench.hitrate import Instance
    from ucmctl.bench.runner import (
        BenchConfig,
        Target,
        model_path_of,
        run_bench,
        server_facts,
        strip_private,
        target_from_deployment,
        vocabulary_refused,
    )

    if deployment is not None and url is not None:
        raise UcmctlError.one("--deployment and --url both given", fix="pass one of them")
    if plot:
        report.check_plot_available()
    digest = topo_path = None
    model_path = None
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
    else:
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
    facts = asyncio.run(server_facts([target.url, *(i.url for i in target.instances)]))
    if model is None:
        model = facts.model
    if input_len is not None:
        input_lens = _ints(input_len, "--input-len")
    else:
        input_lens = [_default_input_len(facts.max_model_len, output_len)]
        err.print(f"input length {input_lens[0]} tokens (the default; --input-len to choose)", soft_wrap=True)
    vocab, checked = _vocabulary(model_dir, vocab, [model_path, facts.root])
    if not checked:
        refused = asyncio.run(vocabulary_refused(target.url + endpoint, vocab, model))
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
        concurrency=concurrency,
        output_len=output_len,
        request_rate=_rate(request_rate),
        ignore_eos=ignore_eos,
        seed=seed,
        reset_hbm=reset_hbm,
        repeats=repeats,
        vocab=vocab,
        model=model,
        temperature=temperature,
        settle_s=settle,
        timeout_s=timeout,
    )
    progress = None if quiet else RichProgress(err)
    cells = strip_private(asyncio.run(run_bench(cfg, target, progress, log=err.print)))
    report.print_cells(cells, out)
    target_info = {
        "url": target.url,
        "deployment": deployment,
        "instances": [i.__dict__ for i in target.instances],
    }
    doc = report.document(cells, cfg.as_dict(), report.provenance(digest, topo_path), target_info)
    _write_outputs(cells, doc, save, csv, markdown, plot)
    _fail_on_errors(cells)


app.command("run", help="Preseed then measure, per input length (also `ucmctl bench` alone).")(run)


@app.command("suite")
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
) -> None:
    """Run a matrix of input lengths x scenarios (recompute, hbm, ucm), redeploying per scenario.
    Interrupted? Run it again: finished cells are kept in the results file."""
    from ucmctl.bench import report
    from ucmctl.bench.prompts import vocab_from_model
    from ucmctl.bench.runner import run_bench, strip_private
    from ucmctl.bench.suite import DeployApi, ResultsFile, load_suite, run_suite
    from ucmctl.topology.load import load_topology

    the_suite = load_suite(path)
    topo_path = (path.parent / the_suite.topology).resolve()
    topology = load_topology(topo_path)
    if plot:
        report.check_plot_available()
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

    def run_cell(cfg: Any, target: Any) -> list[dict[str, Any]]:
        return strip_private(asyncio.run(run_bench(cfg, target, progress, log=err.print)))

    cells = run_suite(
        the_suite, topology, str(topo_path), results_file, run_cell, DeployApi(), vocab, err.print
    )
    report.print_cells(cells, out)
    out.print(report.markdown(cells))
    prov = report.provenance(topology.digest(), str(topo_path))
    doc = report.document(cells, {**the_suite.model_dump(mode="json"), "vocab": vocab}, prov)
    _write_outputs(cells, doc, save, csv, markdown, plot)
    _fail_on_errors(cells)


@app.command("compare")
def compare(
    baseline: Path = typer.Argument(
        ..., help="saved result, or a folder of repeated results", show_default=False
    ),
    new: Path = typer.Argument(..., help="saved result, or a folder of repeated results", show_default=False),
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
) -> None:
    """Exit 0 within limits, 5 on a regression, 2 on bad input; prints a Markdown summary."""
    from ucmctl.bench import compare as cmp

    limits = cmp.parse_limits(max_regression or cmp.DEFAULT_LIMITS)
    verdicts = cmp.compare(cmp.load_side(baseline), cmp.load_side(new), limits, repeats)
    text = cmp.markdown(verdicts)
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
