from __future__ import annotations

from pathlib import Path

import pytest

from ucmctl.plan.build import build_plan
from ucmctl.plan.model import Plan
from ucmctl.topology.load import load_topology

REPO = Path(__file__).resolve().parents[3]
TOPOLOGIES = REPO / "topologies"


@pytest.fixture(scope="session")
def plans() -> dict[str, Plan]:
    return {p.stem: build_plan(load_topology(p)) for p in sorted(TOPOLOGIES.glob("*.yaml"))}
