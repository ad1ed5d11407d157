"""`ucmctl sim serve` and `ucmctl sim calibrate`."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sys

import typer

app = typer.Typer(help="A vLLM-compatible simulator engine (no GPU needed).", no_args_is_help=True)


@app.command(
    "serve",
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
