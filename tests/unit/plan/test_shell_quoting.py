"""Values from a topology reach the shell as single harmless arguments: run a rendered script."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from ucmctl.plan.build import build_plan
from ucmctl.topology.load import parse_topology

HOSTILE = "/models/my model $(touch PWNED1) `touch PWNED2`; touch PWNED3 'q\" \\ *"


def test_hostile_values_stay_one_argument_each(tmp_path: Path) -> None:
    workdir = tmp_path / "work dir"
    topology = parse_topology(
        f"""
name: quoting
mode: mixed
model: {{path: {json.dumps(HOSTILE)}}}
nodes:
  me: {{host: 127.0.0.1, transport: local, platform: cpu, workdir: {json.dumps(str(workdir))}}}
storage: {{storage_backends: {json.dumps(str(tmp_path / "store $(touch PWNED4)"))}}}
mixed:
  nodes: [me]
  env: {{EVIL: "$(touch PWNED5); `id`"}}
  flags: {{chat-template: "a b;$(touch PWNED6)", enforce-eager: true}}
"""
    )
    server = build_plan(topology).process("mixed-0")
    for f in server.files:
        Path(f.path).parent.mkdir(parents=True, exist_ok=True)
        Path(f.path).write_text(f.content)
        os.chmod(f.path, f.mode)

    # A stand-in `vllm` that reports the argv and environment it was given.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "vllm"
    fake.write_text(
        f"#!{sys.executable}\nimport json, os, sys\n"
        "print(json.dumps({'argv': sys.argv[1:], 'evil': os.environ['EVIL'], 'cwd': os.getcwd()}))\n"
    )
    fake.chmod(0o755)
    run = subprocess.run(
        ["sh", server.launch],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"},
        check=True,
    )
    seen = json.loads(run.stdout)
    assert seen["argv"] == server.argv[1:]
    assert seen["argv"][1] == HOSTILE
    assert seen["evil"] == "$(touch PWNED5); `id`"
    assert seen["cwd"] == str(workdir / "quoting" / "mixed-0")
    assert "a b;$(touch PWNED6)" in seen["argv"]
    kv = json.loads(seen["argv"][seen["argv"].index("--kv-transfer-config") + 1])
    assert kv["kv_connector_extra_config"]["UCM_CONFIG_FILE"].startswith(str(workdir))
    assert not list(tmp_path.rglob("PWNED*")) and not list(Path.cwd().glob("PWNED*"))
