"""A new user's first run, typed as the README has it, on this machine with the simulator:
`ucmctl up T && ucmctl bench --prefix-ratio 0.8 --num-prompts 8 && ucmctl down`. No deployment
is named and no vocabulary given: both come from the one deployment, whose model's tokenizer
knows fewer ids than bench's fallback vocabulary (as the embedded default's model does)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.bench.test_bench_vocab import VOCAB, small_vocab_model
from tests.support.processes import free_port

pytestmark = pytest.mark.slow


def topology(tmp: Path) -> Path:
    work = tmp / "work"
    path = tmp / "first.yaml"
    path.write_text(
        f"""
name: first-run
mode: centralized
engine: sim
model: {{path: {json.dumps(str(small_vocab_model(tmp / "model")))}}}
nodes:
  me: {{host: 127.0.0.1, transport: local, platform: cpu, python: {sys.executable},
        workdir: {json.dumps(str(work))}}}
storage: {{storage_backends: {json.dumps(str(work / "store"))}, cache_buffer_capacity_gb: 0.25}}
prefill: {{nodes: [me], port: {free_port()}, flags: {{max-model-len: 8192}}}}
decode: {{nodes: [me], port: {free_port()}, flags: {{max-model-len: 8192}}}}
proxy: {{node: me, port: {free_port()}}}
"""
    )
    return path


def test_up_bench_down_as_typed(tmp_path: Path) -> None:
    topo = topology(tmp_path)
    ucmctl = f"{sys.executable} -m ucmctl"
    env = {**os.environ, "UCMCTL_HOME": str(tmp_path / "home"), "COLUMNS": "80"}
    line = f"{ucmctl} up {topo} && {ucmctl} bench --prefix-ratio 0.8 --num-prompts 8 && {ucmctl} down"
    try:
        done = subprocess.run(["sh", "-c", line], capture_output=True, text=True, env=env, timeout=600)
    finally:  # whatever happened, leave nothing running
        subprocess.run([sys.executable, "-m", "ucmctl", "down", str(topo)], capture_output=True, env=env)
    said = done.stdout + done.stderr
    assert done.returncode == 0, said[-4000:]
    assert "Traceback" not in said and "…" not in said
    assert f"vocabulary {VOCAB} ids, from {tmp_path / 'model'}" in done.stderr
    assert "input length 4096 tokens" in done.stderr
    assert "deployment first-run is up" in done.stdout
    assert "3 processes stopped" in done.stdout
    rows = [r.split() for r in done.stdout.splitlines() if r.startswith("4096 ")]
    ok_failed = [(r[2], r[3]) for r in rows if len(r) == 9]  # input phase ok failed req/s ...
    assert ok_failed == [("8", "0"), ("8", "0")], done.stdout  # preseed and measure: all 8 answered
