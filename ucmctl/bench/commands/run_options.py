"""`ucmctl bench`'s (`bench run`'s) options: the run's, one `typer.Option` each in the order
`--help` lists them, then every workload's parameters, made from their table
(`workload_defaults.PARAMS`); `RunOptions`, the values one run was given."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, TypeVar

import typer

from ucmctl.bench import workload_defaults as defaults
from ucmctl.bench.commands.common import HISTORY_HELP, SALT_HELP

DEFAULT_VOCAB = 8000
Command = TypeVar("Command", bound=Callable[..., None])


def param_option(param: defaults.Param) -> Any:
    """A workload parameter's option: `--name`, its default, its bounds and its help (which
    names the workload)."""
    return typer.Option(param.default, param.option, min=param.ge, max=param.le, help=param.help)


def with_workload_options(command: Command) -> Command:
    """`command` (whose `**params` takes them) with every workload's parameters as options."""
    signature = inspect.signature(command)
    own = [p for p in signature.parameters.values() if p.kind is not inspect.Parameter.VAR_KEYWORD]
    added = [
        inspect.Parameter(
            param.name,
            inspect.Parameter.KEYWORD_ONLY,
            default=param_option(param),
            annotation=param.annotation,
        )
        for table in defaults.PARAMS.values()
        for param in table.values()
    ]
    command.__signature__ = signature.replace(parameters=[*own, *added])  # type: ignore[attr-defined]
    return command


DEPLOYMENT = typer.Option(None, "--deployment", "-d", help="a deployment started by `ucmctl up`")
URL = typer.Option(
    None,
    "--url",
    help="any OpenAI-compatible server, e.g. http://127.0.0.1:8000; several, comma-separated (proxy "
    "replicas): requests go to each in turn, and on to the next when one refuses the connection",
)
ENGINE = typer.Option(
    None,
    "--engine",
    help="with --url: the engine serving there, whose metric names are read (default: vllm)",
)
METRICS_URL = typer.Option(
    [],
    "--metrics-url",
    help="with --url: servers whose /metrics give the hit rate (repeatable; default: the --url itself)",
)
WORKLOAD = typer.Option(
    "prefix",
    "--workload",
    "-w",
    help="prefix (preseed then measure), multi-turn, trace (--trace FILE) or long-doc",
)
CONCURRENCY = typer.Option(
    None,
    "--concurrency",
    help="requests in flight at most; a list sweeps, e.g. 1,4,16 (default: prefix 128, "
    "multi-turn one per user, long-doc 8, trace 1024)",
)
OUTPUT_LEN = typer.Option(
    None,
    "--output-len",
    min=1,
    help="output tokens (prefix 1000, multi-turn: each answer, 128; long-doc: each query, 100; "
    "trace: the trace's own)",
)
REQUEST_RATE = typer.Option(
    "inf", "--request-rate", help="inf (all at once) or requests/s (Poisson); a list sweeps, e.g. 1,2,4"
)
GOODPUT = typer.Option(
    [],
    "--goodput",
    help="SLOs for goodput, as vllm bench serve: --goodput ttft:500 tpot:50 e2el:20000 (ms)",
)
IGNORE_EOS = typer.Option(True, "--ignore-eos/--no-ignore-eos", help="always generate --output-len")
SEED = typer.Option(0, "--seed", min=0, help="prompts of different seeds share no prefix")
MODEL = typer.Option(None, "--model", help="served model name (default: /v1/models' first)")
MODEL_DIR = typer.Option(None, "--model-dir", help="model folder: its vocabulary bounds the ids")
VOCAB = typer.Option(
    None,
    "--vocab",
    min=256,
    help="token ids are drawn below this (default: from the model folder of the deployment or "
    f"of the server's /v1/models when this machine can read it, else {DEFAULT_VOCAB}, checked "
    "with one request)",
)
TEMPERATURE = typer.Option(None, "--temperature", help="sent when given")
SETTLE = typer.Option(0.0, "--settle", min=0.0, help="seconds to wait between the phases")
ENDPOINT = typer.Option("/v1/completions", "--endpoint")
TIMEOUT = typer.Option(6 * 3600, "--timeout", help="seconds one request may take")
SAVE = typer.Option(None, "--save", help="JSON result (vllm bench serve's key names)")
CSV = typer.Option(None, "--csv")
MARKDOWN = typer.Option(None, "--markdown")
PLOT = typer.Option(None, "--plot", help="PNG of TTFT and E2EL by cell; with a sweep also NAME-capacity.png")
QUIET = typer.Option(False, "--quiet", "-q", help="no progress bars")
FAIL_FAST = typer.Option(
    False, "--fail-fast", help="stop at once when a process of the deployment dies or turns unhealthy"
)
FAULT = typer.Option(
    None,
    "--fault",
    help="ACTION:PROCESS@TIME, e.g. kill:decode-0@30s: SIGKILL (kill), SIGTERM (stop) or SIGSTOP "
    "(hang, SIGCONT at the phase's end) to a process of the deployment that far into the first "
    "measure phase, and what it cost",
)
CACHE_SALT = typer.Option(None, "--cache-salt", help=SALT_HELP)
HISTORY_FILE = typer.Option(None, "--history", help=HISTORY_HELP)
LABEL = typer.Option(None, "--label", help="this run's name in the history, e.g. nightly")
SAMPLE_INTERVAL = typer.Option(
    1.0,
    "--sample-interval",
    min=0.0,
    help="seconds between two reads of every instance's /metrics in a phase, kept in the result (0: none)",
)


@dataclass
class RunOptions:
    """The options of one `ucmctl bench` run, as typed (Typer has checked their ranges): the
    run's, and the workloads' parameters by name (`params`)."""

    deployment: str | None
    url: str | None
    engine: str | None
    metrics_url: list[str]
    workload: str
    concurrency: str | None
    output_len: int | None
    request_rate: str
    goodput: list[str]
    ignore_eos: bool
    seed: int
    model: str | None
    model_dir: Path | None
    vocab: int | None
    temperature: float | None
    settle: float
    endpoint: str
    timeout: float
    save: Path | None
    csv: Path | None
    markdown: Path | None
    plot: Path | None
    quiet: bool
    fail_fast: bool
    fault: str | None
    cache_salt: str | None
    history_file: str | None
    label: str | None
    sample_interval: float
    params: dict[str, Any]

    @classmethod
    def of(cls, values: dict[str, Any]) -> RunOptions:
        """The options among `values` (the run callback's arguments, its `params` the workloads'
        parameters; others are left out)."""
        return cls(**{f.name: values[f.name] for f in fields(cls)})
