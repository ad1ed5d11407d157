"""The connector and the store run inside vLLM on the nodes: reading the UCM config's schema
(ucmctl.ucm_config, same wheel) must not pull in the control plane."""

from __future__ import annotations

import subprocess
import sys


def test_connector_config_imports_no_control_plane() -> None:
    code = (
        "import sys, ucm_connector.config, ucm_connector.store\n"
        "heavy = sorted(m for m in sys.modules if m.startswith(('ucmctl.', 'typer', 'rich', 'fabric'))"
        " and m != 'ucmctl.ucm_config')\n"
        "print(','.join(heavy))"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert run.stdout.strip() == ""
