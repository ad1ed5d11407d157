"""Shared builders for the bench tests: synthetic results and a CLI runner like `ucmctl`'s main."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import typer
from typer.testing import CliRunner

from ucmctl.bench.commands import app as bench_app
from ucmctl.bench.commands import spread_option_values
from ucmctl.bench.provenance import provenance
from ucmctl.bench.report import document
from ucmctl.core.errors import UcmctlError


def invoke(*args: str) -> tuple[int, str]:
    """(exit status, output) of `ucmctl bench ARGS`, with UcmctlError mapped as main() maps it."""
    root = typer.Typer()
    root.add_typer(bench_app, name="bench")

    @root.callback()
    def _root() -> None:
        pass

    result = CliRunner().invoke(root, spread_option_values(["bench", *args]))
    if isinstance(result.exception, UcmctlError):
        return int(result.exception.status), result.output + str(result.exception)
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result.exit_code, result.output


def measure(
    ttft: float, tpot: float = 10.0, e2el: float = 1000.0, throughput: float = 100.0
) -> dict[str, Any]:
    m: dict[str, Any] = {
        "completed": 8,
        "failed": 0,
        "output_len": 100,
        "input_len": 1000,
        "output_throughput": throughput,
        "request_throughput": 1.0,
    }
    for name, v in (("ttft", ttft), ("tpot", tpot), ("itl", tpot), ("e2el", e2el)):
        for stat in ("mean", "median", "std", "p90", "p99"):
            m[f"{stat}_{name}_ms"] = v
    return m


def write_result(path: Path, cells: list[dict[str, Any]]) -> Path:
    doc = document(cells, {"num_prompts": 8}, provenance(argv=["test"]))
    path.write_text(json.dumps(doc))
    return path


def cell(input_len: int, ttft: float, scenario: str | None = None, **kw: float) -> dict[str, Any]:
    return {
        "input_len": input_len,
        "repeat": 0,
        "prefix_ratio": 0.8,
        "scenario": scenario,
        "preseed": None,
        "measure": measure(ttft, **kw),
    }
