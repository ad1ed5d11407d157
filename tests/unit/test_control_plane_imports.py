"""The control plane drives clusters it does not belong to: it must import without torch/vLLM."""

from __future__ import annotations

import subprocess
import sys


def test_cli_and_plan_import_without_torch_or_vllm() -> None:
    code = (
        "import sys, ucmctl.cli, ucmctl.plan.build, ucmctl.topology.load\n"
        "heavy = sorted(m for m in ('torch', 'vllm', 'ucm_store', 'ucm_connector') if m in sys.modules)\n"
        "print(','.join(heavy))"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert run.stdout.strip() == ""


def test_the_command_line_starts_without_pydantic_or_the_workload_specs() -> None:
    # Every command (`ucmctl status`, `--help`, the proxy and the simulator started as
    # `python -m ucmctl ...`) pays for what `ucmctl.cli` imports: 0.26 s, 0.5 s with pydantic.
    code = (
        "import sys, ucmctl.cli\n"
        "print(','.join(m for m in ('pydantic', 'ucmctl.bench.workloads') if m in sys.modules))"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert run.stdout.strip() == ""
