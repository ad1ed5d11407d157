"""The layer contract (pyproject's [tool.importlinter]) is live: an upward import breaks it."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
# lint-imports on the copy: the editable install's finder would find the checkout's ucmctl first.
LINT = """
import sys
sys.meta_path[:] = [f for f in sys.meta_path if "editable" not in type(f).__module__]
sys.path.insert(0, sys.argv[1])
from importlinter.cli import lint_imports
sys.exit(lint_imports(config_filename=sys.argv[1] + "/pyproject.toml", cache_dir=None, no_cache=True))
"""


def _lint(root: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", LINT, str(root)], cwd=root, capture_output=True, text=True)


@pytest.fixture
def copy(tmp_path: Path) -> Path:
    shutil.copytree(REPO / "ucmctl", tmp_path / "ucmctl", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO / "pyproject.toml", tmp_path)
    return tmp_path


def test_the_checkout_keeps_every_contract(copy: Path) -> None:
    run = _lint(copy)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "4 kept, 0 broken" in run.stdout


@pytest.mark.parametrize(
    ("module", "imported", "contract"),
    [
        ("core/words.py", "ucmctl.plan.model", "layers import one way"),
        ("topology/layout.py", "ucmctl.plan.model", "layers import one way"),
        ("nodes/fanout.py", "ucmctl.launch", "layers import one way"),
        ("proxy/health.py", "ucmctl.topology.model", "import only ucmctl.core"),
        ("sim/tokens.py", "ucmctl.proxy.rewrite", "do not import each other"),
        ("k8s/render.py", "ucmctl.topology.model", "never the topology"),
    ],
)
def test_an_upward_import_breaks_the_contract(copy: Path, module: str, imported: str, contract: str) -> None:
    path = copy / "ucmctl" / module
    path.write_text(path.read_text() + f"\nimport {imported}  # noqa\n")
    run = _lint(copy)
    assert run.returncode == 1, run.stdout
    broken = [line for line in run.stdout.splitlines() if line.endswith("BROKEN")]
    assert len(broken) == 1 and contract in broken[0], run.stdout
    dotted = "ucmctl." + module.removesuffix(".py").replace("/", ".")
    assert f"{dotted} -> {imported}" in run.stdout


def test_the_product_package_carries_no_test_helper() -> None:
    assert not (REPO / "ucmctl" / "testing").exists()
    for path in (REPO / "ucmctl").rglob("*.py"):
        text = path.read_text()
        assert "from tests" not in text and "import tests" not in text, path
