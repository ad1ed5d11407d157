"""`ucmctl sim serve` and `ucmctl sim calibrate`."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sys
from pathlib import Path

import typer

app = typer.Typer(
    rich_markup_mode=None, help="A vLLM-compatible simulator engine (no GPU needed).", no_args_is_help=True
)


@app.command(
    "serve",
    short_help="Serve like `vllm serve MODEL [flags]`",
    context_settings={"allow_extra_args": True, "ignore_unknown_options": True, "help_option_names": []},
    add_help_option=False,
)
def serve(ctx: typer.Context) -> None:
    """Serve like `vllm serve MODEL [flags]` (run with --help for the flags it models)."""
    from ucmctl.sim.args import parse_serve_args
    from ucmctl.sim.server import SimServer
    from ucmctl.sim.server import serve as run
    from ucmctl.sim.tokens import load_tokenizer

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s", stream=sys.stderr)
    config, ignored = parse_serve_args(list(ctx.args))
    if ignored:
        logging.warning("sim: ignoring flags it does not model: %s", " ".join(ignored))
    server = SimServer(config, load_tokenizer(config.model))
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(run(server))


@app.command("calibrate", short_help="Measure a real vLLM server into a simulator profile")
def calibrate(
    url: str = typer.Option(..., "--url", help="a running vLLM server, e.g. http://127.0.0.1:8000"),
    out: Path = typer.Option(Path("sim-profile.json"), "--out", help="profile file to write"),
    model_dir: Path | None = typer.Option(None, "--model-dir", help="model folder (sizes the KV blocks)"),
    kv_bytes_per_token: int = typer.Option(0, "--kv-bytes-per-token", help="instead of --model-dir"),
    lengths: str = typer.Option("256,1024,2048,4096", "--lengths", help="prefill prompt lengths"),
    batches: str = typer.Option("1,4,8", "--batches", help="decode batch sizes"),
    vocab: int = typer.Option(8000, "--vocab", help="token ids are drawn below this"),
    name: str = typer.Option("calibrated", "--name", help="profile name"),
) -> None:
    """Measure a real vLLM server and write a simulator profile fitted to it."""
    from ucmctl.core.errors import UcmctlError
    from ucmctl.sim.calibrate import calibrate as run
    from ucmctl.sim.calibrate import kv_bytes_from_model

    try:
        length_list = [int(x) for x in lengths.split(",")]
        batch_list = [int(x) for x in batches.split(",")]
    except ValueError:
        raise UcmctlError.one("--lengths and --batches take comma-separated integers") from None
    kv = kv_bytes_from_model(model_dir) if model_dir else kv_bytes_per_token
    if kv <= 0:
        raise UcmctlError.one("say how large a token's KV is", fix="pass --model-dir or --kv-bytes-per-token")
    profile = run(
        url, out, lengths=length_list, batches=batch_list, vocab=vocab, kv_bytes_per_token=kv, name=name
    )
    typer.echo(f"wrote {out}: {profile.model_dump_json()}")
