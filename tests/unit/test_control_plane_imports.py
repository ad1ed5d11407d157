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
