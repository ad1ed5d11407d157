"""One driver per process: a launcher hands each operation on a process to the driver of that
process (its own process group, or its container's runtime), and the driver says how the process is."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from ucmctl.launch.driver import BARE, CONTAINED, driver_of
from ucmctl.launch.nodes import NodeLauncher
from ucmctl.nodes import containers, lifecycle
from ucmctl.nodes.containers import ContainerState
from ucmctl.nodes.lifecycle import Supervised
from ucmctl.nodes.run_state import Kind, RunState
from ucmctl.plan.build import build_plan
from ucmctl.plan.model import Plan, Process, RestartPlan
from ucmctl.topology.load import load_topology

TOPOLOGIES = Path(__file__).resolve().parents[3] / "topologies"
OPERATIONS = ("start", "alive", "watch", "stop", "signal", "log_tail")


def plan(name: str) -> Plan:
    return build_plan(load_topology(TOPOLOGIES / name))


def recorded(monkeypatch: pytest.MonkeyPatch) -> list[tuple[Any, ...]]:
    """Every operation of both drivers' modules, recorded instead of run: (module, operation,
    executor, process, args, keyword args)."""
    calls: list[tuple[Any, ...]] = []
    for module in (lifecycle, containers):
        short = module.__name__.rsplit(".", 1)[1]
        for name in OPERATIONS:

            def fake(ex: Any, p: Process, *args: Any, _m: str = short, _n: str = name, **kw: Any) -> str:
                calls.append((_m, _n, ex, p.name, args, kw))
                return f"{_m}.{_n}"

            monkeypatch.setattr(module, name, fake)
    return calls


def launcher_on(plan: Plan, node: str, ex: object) -> NodeLauncher:
    launcher = NodeLauncher(plan)
    launcher._executors[node] = ex  # type: ignore[assignment]
    return launcher


def test_a_process_gets_the_driver_of_how_it_runs() -> None:
    bare, contained = plan("2p2d-centralized.yaml").processes, plan("1p1d-podman.yaml").processes
    assert {driver_of(p) for p in bare} == {BARE} and not any(p.detached for p in bare)
    assert {driver_of(p) for p in contained} == {CONTAINED} and all(p.detached for p in contained)


@pytest.mark.parametrize(
    ("topology", "module", "signalled"),
    [("2p2d-centralized.yaml", "lifecycle", {"spare_leader": False}), ("1p1d-podman.yaml", "containers", {})],
)
def test_every_operation_goes_to_the_driver_of_the_process(
    monkeypatch: pytest.MonkeyPatch, topology: str, module: str, signalled: dict[str, bool]
) -> None:
    calls = recorded(monkeypatch)
    p = plan(topology).processes[0]
    ex = object()
    launcher = launcher_on(plan(topology), p.node, ex)
    said = [launcher.start(p), launcher.alive(p), launcher.watch(p), launcher.stop(p, grace=3),
            launcher.signal(p, "KILL"), launcher.log_tail(p, 7)]  # fmt: skip
    assert said == [f"{module}.{name}" for name in OPERATIONS]
    assert calls == [
        (module, "start", ex, p.name, (), {}),
        (module, "alive", ex, p.name, (), {}),
        (module, "watch", ex, p.name, (), {}),
        (module, "stop", ex, p.name, (), {"grace": 3}),
        (module, "signal", ex, p.name, ("KILL",), signalled),
        (module, "log_tail", ex, p.name, (7,), {}),
    ]


@pytest.mark.parametrize(("by", "spare"), [("supervisor", True), ("systemd", False)])
def test_a_supervised_process_s_signal_spares_its_supervisor(
    monkeypatch: pytest.MonkeyPatch, by: str, spare: bool
) -> None:
    calls = recorded(monkeypatch)
    p = plan("2p2d-centralized.yaml").processes[0]
    p = p.model_copy(update={"restart": RestartPlan(by=by, max_restarts=2, backoff_s=1.0)})  # type: ignore[arg-type]
    BARE.signal(object(), p, "TERM")  # type: ignore[arg-type]
    assert calls[-1][-2:] == (("TERM",), {"spare_leader": spare})


@pytest.mark.parametrize(
    ("restart", "alive", "told", "state"),
    [
        (None, 7, None, RunState.up()),
        (None, None, None, RunState(Kind.not_running)),  # no supervisor saw how it ended
        ("supervisor", 7, Supervised(2, 137, "running"), RunState.up(2, last_exit=137)),
        ("supervisor", None, Supervised(3, 1, "gave-up"), RunState.gave_up(1, 3)),
        ("supervisor", None, None, RunState(Kind.not_running)),  # nothing written yet
        ("systemd", None, Supervised(1, 137, "waiting", by_systemd=True), RunState.restarting(137, 1, 2)),
    ],
)
def test_a_bare_process_s_state_is_its_group_and_what_restarts_it(
    monkeypatch: pytest.MonkeyPatch, restart: str | None, alive: int | None, told: Supervised | None,
    state: RunState,
) -> None:  # fmt: skip
    asked: list[str] = []

    def supervised(ex: Any, p: Process) -> Supervised | None:
        asked.append(p.name)
        return told

    monkeypatch.setattr(lifecycle, "alive", lambda ex, p: alive)
    monkeypatch.setattr(lifecycle, "supervised", supervised)
    p = plan("2p2d-centralized.yaml").processes[0]
    if restart is not None:
        p = p.model_copy(update={"restart": RestartPlan(by=restart, max_restarts=2, backoff_s=1.0)})  # type: ignore[arg-type]
    assert BARE.run_state(object(), p) == state  # type: ignore[arg-type]
    assert asked == ([] if restart is None else [p.name])  # no restart policy: nothing to ask


@pytest.mark.parametrize(
    ("container", "state"),
    [
        (None, RunState(Kind.no_container)),
        (ContainerState("decode-0", "running", 0, 42, 1), RunState.up(1)),
        (ContainerState("decode-0", "exited", 137, 0, 2), RunState.exited(137, 2)),
    ],
)
def test_a_contained_process_s_state_is_what_its_runtime_says(
    monkeypatch: pytest.MonkeyPatch, container: ContainerState | None, state: RunState
) -> None:
    monkeypatch.setattr(containers, "state", lambda ex, p: container)
    p = plan("1p1d-podman.yaml").processes[0]
    launcher = launcher_on(plan("1p1d-podman.yaml"), p.node, object())
    assert launcher.run_state(p) == state
