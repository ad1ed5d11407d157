"""Each example topology's Plan equals its checked-in golden JSON (UCMCTL_UPDATE_GOLDEN=1 rewrites)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.unit.plan.conftest import REPO, TOPOLOGIES
from ucmctl.plan.build import build_plan
from ucmctl.plan.show import plan_json
from ucmctl.topology.load import load_topology

GOLDEN = Path(__file__).parent / "golden"
EXAMPLES = sorted(TOPOLOGIES.glob("*.yaml"))


def test_every_layout_of_the_guides_has_an_example() -> None:
    assert {p.stem for p in EXAMPLES} >= {
        "local-1p1d", "1p1d", "2p2d-centralized", "2p2d-p2p", "pd-mixed", "xpyd",
        "ep-dp4tp8-dp8tp4", "hetero-ascend-cuda",
    }  # fmt: skip


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_plan_matches_golden(path: Path) -> None:
    # A local topology resolves its model path against its own folder: keep the repo out of it.
    actual = plan_json(build_plan(load_topology(path))).replace(str(REPO), "<repo>")
    golden = GOLDEN / f"{path.stem}.json"
    if os.environ.get("UCMCTL_UPDATE_GOLDEN") == "1":
        golden.parent.mkdir(exist_ok=True)
        golden.write_text(actual)
    assert golden.exists(), f"no golden file for {path.name}: run with UCMCTL_UPDATE_GOLDEN=1"
    assert json.loads(actual) == json.loads(golden.read_text())
