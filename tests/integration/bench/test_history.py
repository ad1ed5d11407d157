"""Every `ucmctl bench` run against a deployment (a 1P1D of the simulator on this machine) lands
in the results history with the provenance `up` read on the nodes; `bench history` lists and
filters the runs and draws their trends at 80 columns, as a user types it."""

from __future__ import annotations

import importlib.metadata
import json
import os
import platform
import sqlite3
import subprocess
import sys
import zlib
from pathlib import Path

import pytest

from tests.integration.deploy.test_local_lifecycle import deployed, topology
from ucmctl import __version__

pytestmark = pytest.mark.slow

BENCH = ["bench", "--input-len", "64", "--output-len", "4", "--num-prompts", "8", "-q"]


def cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(": ", 1)[1]
    return ""


def test_runs_land_in_the_history_with_the_nodes_provenance(tmp_path: Path) -> None:
    home, workdir = tmp_path / "home", tmp_path / "work"
    env = {**os.environ, "UCMCTL_HOME": str(home), "COLUMNS": "80"}
    env.pop("UCMCTL_HISTORY")  # the default: in ucmctl's home

    def ucmctl(*args: str) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(
            [sys.executable, "-m", "ucmctl", *args], capture_output=True, text=True, env=env, timeout=300
        )
        assert "Traceback" not in done.stdout + done.stderr, done.stderr
        return done

    with deployed(home, topology(tmp_path, "t-hist", workdir), workdir):
        saved = tmp_path / "first.json"
        runs = [
            ucmctl(*BENCH, "--label", "nightly", "--save", str(saved)),
            ucmctl(*BENCH, "--label", "nightly", "--sample-interval", "0"),
            ucmctl(*BENCH, "--input-len", "128", "--label", "pr-7"),
        ]
    history = home / "history.sqlite"
    for i, run in enumerate(runs, 1):
        assert run.returncode == 0, run.stderr
        assert f"recorded as run #{i} in {history}" in run.stderr.replace("\n", ""), (
            run.stderr
        )  # folded at 80
    with sqlite3.connect(history) as db:
        rows = db.execute(
            "SELECT deployment, label, provenance_key, provenance, key_fields FROM runs"
        ).fetchall()
    assert [(d, label) for d, label, *_ in rows] == [
        ("t-hist", "nightly"),
        ("t-hist", "nightly"),
        ("t-hist", "pr-7"),
    ]
    keys = [r[2] for r in rows]
    assert keys[0] == keys[1] != keys[2]  # each run its own salt; another input length: another key
    first, third = json.loads(rows[0][4]), json.loads(rows[2][4])
    assert {k for k in first if first[k] != third.get(k)} == {"config.input_lens"}
    prov = json.loads(rows[0][3])
    me = prov["nodes"]["me"]
    assert me["engine"] == f"sim {__version__}" and me["platform"] == "cpu"
    assert me["torch"] == importlib.metadata.version("torch")
    assert me["python"] == platform.python_version() and me["cpu_model"] == cpu_model()
    assert prov["model"] == "sim-model" and len(prov["plan_digest"]) == 16 and prov["engine"] == "sim"
    assert prov == json.loads(saved.read_text())["provenance"]  # what --save wrote, the same

    # The measure phase's server series (a read a second, one at its end) and the KV handover
    # the proxy measured for each of its 8 streamed requests, next to TTFT.
    (cell,) = json.loads(saved.read_text())["cells"]
    measure = cell["measure"]
    series = measure["series"]
    # the first read as the phase begins (its time is when the read began: a loaded machine
    # starts it a few ms late, and the series says so)
    assert series["interval_s"] == 1.0 and 0.0 <= series["t"][0] < 0.5 and series["t"] == sorted(series["t"])
    assert series["t"][-1] >= measure["duration"] - 0.5
    assert set(series["instances"]) == {"prefill-0", "decode-0"}
    decode = series["instances"]["decode-0"]
    assert decode["role"] == "decode" and len(decode["running"]) == len(series["t"])
    assert decode["local_queries"][-1] - decode["local_queries"][0] == 8 * 64  # the phase's prompts
    handed = measure["kv_handover"]
    assert handed["count"] == 8 and 0 < handed["mean_ms"] < measure["mean_ttft_ms"]
    assert 0 < handed["p50_ms"] <= handed["p99_ms"]
    said = " ".join(runs[0].stdout.split())
    assert "measure 64: KV handover (proxy, 8 streamed): mean" in said, runs[0].stdout
    unsampled = sqlite3.connect(history).execute("SELECT document FROM runs WHERE id = 2").fetchone()[0]
    (cell,) = json.loads(zlib.decompress(unsampled))["cells"]
    assert "series" not in cell["measure"] and cell["measure"]["kv_handover"]["count"] == 8

    listed = ucmctl("bench", "history")
    assert listed.returncode == 0, listed.stderr
    text = listed.stdout
    assert max(len(line) for line in text.splitlines()) <= 80, text
    assert "runs (3, oldest first)" in text and "trend of run/64" in text and "trend of run/128" in text
    trend64 = text.split("trend of run/64")[1].split("trend of")[0]
    assert [line.split()[0] for line in trend64.splitlines() if line.strip().startswith("#")] == ["#1", "#2"]
    only = ucmctl("bench", "history", "--label", "pr-7", "--plot", str(tmp_path / "plots"))
    assert only.returncode == 0, only.stderr
    assert "runs (1, oldest first)" in only.stdout and "run/64" not in only.stdout
    assert sorted(p.name for p in (tmp_path / "plots").iterdir()) == [
        "e2el_mean.png",
        "hit_rate.png",
        "output_throughput.png",
        "tpot_mean.png",
        "ttft_mean.png",
    ]
    assert ucmctl("bench", "history", "--key", keys[0][:8]).stdout.count("nightly") == 2
