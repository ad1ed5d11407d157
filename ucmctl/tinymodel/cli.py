"""`ucmctl model ...`: the small-model tool as a typer sub-app."""

from __future__ import annotations

from pathlib import Path

import typer

app = typer.Typer(
    rich_markup_mode=None, help="Build small local models (no model hub needed).", no_args_is_help=True
)


@app.callback()
def model() -> None:
    """Build small local models (no model hub needed)."""
    # A callback keeps `make-tiny` a named subcommand even while it is the only one.


@app.command("make-tiny", short_help="Build a random-weight Llama and its tokenizer")
def make_tiny(
    out_dir: Path = typer.Argument(..., help="Directory to write the model into."),
    size: str = typer.Option("tiny", "--size", help="Model shape: tiny or medium."),
    seed: int = typer.Option(0, "--seed", help="Seed of weights and tokenizer corpus."),
) -> None:
    """Build a random-weight Llama and a locally trained tokenizer in OUT_DIR."""
    from ucmctl.tinymodel.build import SIZES, make_model

    if size not in SIZES:
        raise typer.BadParameter(f"{size!r} is not a size; valid: {', '.join(SIZES)}", param_hint="--size")
    path = make_model(out_dir, size=size, seed=seed)  # type: ignore[arg-type]
    typer.echo(f"wrote {size} model (seed {seed}) to {path}")
