"""`ucmctl bench` run as a user runs it, for benchmark scripts: the saved result back as JSON."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

UCMCTL = [sys.executable, "-m", "ucmctl"]


def bench_json(url: str, model_dir: Path, out: Path, *args: str, timeout: float = 900) -> dict[str, Any]:
    """`ucmctl bench --url URL --model-dir DIR ARGS --save OUT -q`; the saved document. A failed
    run raises with the tail of its output."""
    cmd = [*UCMCTL, "bench", "--url", url, "--model-dir", str(model_dir), *args, "--save", str(out), "-q"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        raise RuntimeError(
            f"{' '.join(cmd)} exited {done.returncode}: {done.stdout[-2000:]}{done.stderr[-3000:]}"
        )
    doc: dict[str, Any] = json.loads(out.read_text())
    return doc


def make_trace(path: Path, *args: str) -> str:
    """`ucmctl bench make-trace PATH ARGS`; what it printed."""
    cmd = [*UCMCTL, "bench", "make-trace", str(path), *args]
    return subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.strip()
