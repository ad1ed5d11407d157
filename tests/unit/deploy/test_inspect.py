"""`status`'s look at a process: its state as its launcher's runtime gives it, its health asked
only of a process that runs, and an unreachable node said as such."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from ucmctl.deploy import inspect
from ucmctl.deploy.health import HEALTHY, NOT_ASKED, UNKNOWN, Health
from ucmctl.deploy.inspect import Look, look
from ucmctl.nodes.executor import NodeError
from ucmctl.nodes.run_state import Kind, RunState
from ucmctl.plan.build import build_plan
from ucmctl.topology.load import load_topology

TOPOLOGY = Path(__file__).resolve().parents[3] / "topologies" / "2p2d-centralized.yaml"


class Launcher:
    def __init__(self, state: RunState | None) -> None:
        self.state = state

    def run_state(self, p: Any) -> RunState:
        if self.state is None:
            raise NodeError(p.node, "connection refused")
        return self.state


REFUSED = {"http://192.168.10.1:7800/v1/models"}  # prefill-0's health URL: it does not answer


@pytest.fixture
def asked(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    urls: list[str] = []

    def why_not(url: str, timeout: float) -> str | None:
        urls.append(url)
        return "connection refused" if url in REFUSED else None

    monkeypatch.setattr(inspect, "why_not", why_not)
    return urls


def process(name: str = "decode-0") -> Any:
    return next(p for p in build_plan(load_topology(TOPOLOGY)).processes if p.name == name)


def test_a_running_process_is_asked_its_health(asked: list[str]) -> None:
    p = process()
    now = look(Launcher(RunState.up(2, last_exit=137)), p)  # type: ignore[arg-type]
    assert now == Look(RunState.up(2, last_exit=137), HEALTHY) and now.restarts == 2
    assert asked == [p.health[-1]]


def test_an_unhealthy_answer_says_why(asked: list[str]) -> None:
    p = process("prefill-0")
    assert p.health[-1] in REFUSED
    assert look(Launcher(RunState.up()), p) == Look(RunState.up(), Health.of("connection refused"))  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "state", [RunState.exited(137, 1), RunState(Kind.not_running), RunState.restarting(137, 0, 3)]
)
def test_a_process_that_does_not_run_is_not_asked_its_health(asked: list[str], state: RunState) -> None:
    assert look(Launcher(state), process()) == Look(state, NOT_ASKED)  # type: ignore[arg-type]
    assert asked == []


def test_an_unreachable_node_is_a_state_of_its_own(asked: list[str]) -> None:
    now = look(Launcher(None), process())  # type: ignore[arg-type]
    assert now == Look(RunState(Kind.unreachable), UNKNOWN) and now.restarts == 0
    assert now.state.words() == "node unreachable" and asked == []
