"""The proxy is control plane: it must import without torch or vLLM."""

from __future__ import annotations

import subprocess
import sys


def test_proxy_imports_without_torch_or_vllm() -> None:
    code = (
        "import sys, ucmctl.proxy.cli, ucmctl.proxy.app\n"
        "print(','.join(sorted(m for m in ('torch', 'vllm') if m in sys.modules)))"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert run.stdout.strip() == ""
