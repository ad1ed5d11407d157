"""The connector and the store run inside vLLM on the nodes: reading the UCM config's schema
(ucmctl.core.ucm_config, same wheel) must not pull in the control plane: ucmctl.core only."""

from __future__ import annotations

import subprocess
import sys


def test_connector_config_imports_no_control_plane() -> None:
    code = (
        "import sys, ucm_connector.config, ucm_connector.store\n"
        "heavy = sorted(m for m in sys.modules if m.startswith(('ucmctl.', 'typer', 'rich', 'fabric'))"
        " and m != 'ucmctl.core' and not m.startswith('ucmctl.core.'))\n"
        "print(','.join(heavy))\n"
        "print(','.join(sorted(m for m in sys.modules if m.startswith('ucmctl.core.'))))"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    heavy, core = run.stdout.split("\n")[:2]
    assert heavy == ""
    assert core == "ucmctl.core.errors,ucmctl.core.ucm_config"
