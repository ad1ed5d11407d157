"""`ucmctl bench`'s (`bench run`'s) options, one `typer.Option` each in the order `--help`
lists them, and `RunOptions`, the values one run was given."""

from __future__ import annotations

from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import typer

from ucmctl.bench import workload_defaults as defaults
from ucmctl.bench.commands.common import HISTORY_HELP, SALT_HELP

DEFAULT_INPUT_LEN = 4096
DEFAULT_VOCAB = 8000


def param_option(param: defaults.Param) -> Any:
    """A workload parameter's option: `--name`, its default, its lower bound and its help."""
    return typer.Option(param.default, param.option, min=param.ge, help=param.help)


DEPLOYMENT = typer.Option(None, "--deployment", "-d", help="a deployment started by `ucmctl up`")
URL = typer.Option(None, "--url", help="any OpenAI-compatible server, e.g. http://127.0.0.1:8000")
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
INPUT_LEN = typer.Option(
    None,
    "--input-len",
    help=f"prefix: measured prompt lengths, e.g. 4096,8192 (default {DEFAULT_INPUT_LEN}, less where "
    "the server's max_model_len leaves no room for --output-len)",
)
PREFIX_RATIO = typer.Option(
    0.8,
    "--prefix-ratio",
    min=0.0,
    max=0.999,
    help="prefix: preseed length / input length (0: no preseed)",
)
NUM_PROMPTS = typer.Option(128, "--num-prompts", min=1, help="prefix: prompts per phase")
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
USERS, ROUNDS, SYSTEM_TOKENS, QUESTION_TOKENS = map(param_option, defaults.MULTI_TURN_PARAMS.values())
TRACE = typer.Option(
    defaults.TRACE.trace,
    "--trace",
    help="trace: a JSONL trace in Mooncake's format (docs/trace-format.md)",
)
SPEEDUP = typer.Option(
    defaults.TRACE.speedup, "--speedup", help="trace: replay X times faster than its timestamps"
)
BACK_TO_BACK = typer.Option(
    False, "--back-to-back", help="trace: ignore the timestamps, keep --concurrency requests in flight"
)
DOCUMENTS, DOC_TOKENS, REPEAT_COUNT, REPEAT_MODE = map(param_option, defaults.LONG_DOC_PARAMS.values())
IGNORE_EOS = typer.Option(True, "--ignore-eos/--no-ignore-eos", help="always generate --output-len")
SEED = typer.Option(0, "--seed", min=0, help="prompts of different seeds share no prefix")
RESET_HBM = typer.Option(
    False,
    "--reset-hbm",
    help="prefix: clear every instance's local prefix cache between the phases "
    "(real vLLM: needs VLLM_SERVER_DEV_MODE=1)",
)
REPEATS = typer.Option(1, "--repeats", min=1, help="prefix: run everything N times (fresh prompts)")
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
    help="ACTION:PROCESS@TIME, e.g. kill:decode-0@30s: SIGKILL (kill) or SIGTERM (stop) to a "
    "process of the deployment that far into the first measure phase, and what it cost",
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
    """The options of one `ucmctl bench` run, as typed (Typer has checked their ranges)."""

    deployment: str | None
    url: str | None
    engine: str | None
    metrics_url: list[str]
    workload: str
    input_len: str | None
    prefix_ratio: float
    num_prompts: int
    concurrency: str | None
    output_len: int | None
    request_rate: str
    goodput: list[str]
    users: int
    rounds: int
    system_tokens: int
    question_tokens: int
    trace: Path | None
    speedup: float
    back_to_back: bool
    documents: int
    doc_tokens: int
    repeat_count: int
    repeat_mode: str
    ignore_eos: bool
    seed: int
    reset_hbm: bool
    repeats: int
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

    @classmethod
    def of(cls, values: dict[str, Any]) -> RunOptions:
        """The options among `values` (the run callback's arguments; others are left out)."""
        return cls(**{f.name: values[f.name] for f in fields(cls)})
