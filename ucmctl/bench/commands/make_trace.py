"""`ucmctl bench make-trace`: a synthetic trace in Mooncake's format, and its ideal hit ratio."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.markup import escape

from ucmctl.bench.commands.common import out, parse_trace_rate
from ucmctl.core.errors import UcmctlError


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
    from ucmctl.bench.workloads.trace import format as trace

    if pattern not in ("shared-prefix", "sessions", "unique"):
        raise UcmctlError.one(
            f"unknown pattern '{pattern}'", key="--pattern", fix="use shared-prefix, sessions or unique"
        )
    per_s = parse_trace_rate(rate, "--rate")
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
