"""The watch's judgement of what it sees, look by look: a death is reported at the first look,
an unhealthy answer or an unreachable node only after two in a row, each loss once, and a
return as one line (the looks themselves, against a real deployment:
tests/integration/deploy/test_bench_watch.py)."""

from __future__ import annotations

from typing import Any

import pytest

from ucmctl.deploy import watch as watch_mod
from ucmctl.deploy.health import HEALTHY, NOT_ASKED, UNKNOWN, Health
from ucmctl.deploy.inspect import Look
from ucmctl.deploy.watch import Watch
from ucmctl.nodes.run_state import Kind, RunState
from ucmctl.plan.build import build_plan
from ucmctl.topology.load import parse_topology

TOPOLOGY = """
name: w
mode: centralized
engine: sim
model: {path: sim-model}
nodes:
  a: {host: 10.0.0.1, platform: cpu, devices: 0}
  b: {host: 10.0.0.2, platform: cpu, devices: 0}
storage: {storage_backends: /shared/kv}
prefill: {nodes: [a], port: 8000}
decode: {nodes: [b], port: 8001}
proxy: {node: a, port: 8002}
"""


class Record:
    def __init__(self) -> None:
        self.plan = build_plan(parse_topology(TOPOLOGY))
        self.allocation = None


@pytest.fixture
def seen(monkeypatch: pytest.MonkeyPatch) -> tuple[Watch, list[str], Any]:
    monkeypatch.setattr(watch_mod, "tail_of", lambda launcher, p, lines: "its last lines\n")
    said: list[str] = []
    w = Watch(Record(), said.append)  # not started: the test hands it the looks
    decode = next(p for p in w._record.plan.processes if p.name == "decode-0")
    return w, said, decode


def test_a_death_is_reported_at_once_and_once(seen: tuple[Watch, list[str], Any]) -> None:
    w, said, decode = seen
    mark = w.begin("measure 512")
    w._judge(None, decode, Look(RunState.up(), HEALTHY))
    assert said == [] and not w.lost_one.is_set()
    w._judge(None, decode, Look(RunState.exited(137), NOT_ASKED))
    w._judge(None, decode, Look(RunState.exited(137), NOT_ASKED))
    assert said == ["LOST decode-0 on b: exited (137), 0 s into measure 512"]
    (loss,) = w.losses_since(mark)
    assert loss.as_dict() == {
        "process": "decode-0",
        "node": "b",
        "how": "exited (137)",
        "phase": "measure 512",
        "into_s": 0.0,
        "log_tail": "its last lines\n",
    }
    assert w.lost_one.is_set()
    w._judge(None, decode, Look(RunState.up(1), HEALTHY))
    assert said[-1] == "BACK decode-0 on b: running, restarted 1x, healthy"
    assert w.losses_since(mark + 3600) == []  # a later phase lost nothing


@pytest.mark.parametrize(
    ("state", "health"), [(RunState.up(), Health.of("timed out")), (RunState(Kind.unreachable), UNKNOWN)]
)
def test_unhealthy_or_unreachable_counts_after_two_looks_in_a_row(
    seen: tuple[Watch, list[str], Any], state: RunState, health: Health
) -> None:
    w, said, decode = seen
    w.begin("measure 512")
    w._judge(None, decode, Look(state, health))
    w._judge(None, decode, Look(RunState.up(), HEALTHY))  # answered again: the count starts over
    w._judge(None, decode, Look(state, health))
    assert said == []
    w._judge(None, decode, Look(state, health))
    how = health.words() if state.running else "node unreachable"
    assert said == [f"LOST decode-0 on b: {how}, 0 s into measure 512"]
    w.end()
    w._judge(None, decode, Look(RunState(Kind.not_running), NOT_ASKED))  # already lost: not said again
    assert len(said) == 1


def test_a_phase_that_began_without_a_lost_process_records_it(seen: tuple[Watch, list[str], Any]) -> None:
    w, _, decode = seen
    preseed = w.begin("preseed 512")
    w._judge(None, decode, Look(RunState(Kind.not_running), NOT_ASKED))
    w.end()
    measure = w.begin("measure 512")  # decode-0 is still gone: the measure ran without it
    assert [x.phase for x in w.losses_since(preseed)] == ["preseed 512"]
    assert [x.process for x in w.losses_since(measure)] == ["decode-0"]
    w.end()
    w._judge(None, decode, Look(RunState.up(), HEALTHY))
    later = w.begin("measure 1024")  # back before this phase: it lost nothing
    assert w.losses_since(later) == []


def test_the_proxy_answering_503_for_a_lost_upstream_is_not_lost_itself(
    seen: tuple[Watch, list[str], Any],
) -> None:
    w, said, _ = seen
    proxy = next(p for p in w._record.plan.processes if p.name == "proxy")
    w.begin("measure 512")
    for _ in range(3):
        w._judge(None, proxy, Look(RunState.up(), Health.of("HTTP 503")))
    assert said == []
    w._judge(None, proxy, Look(RunState.up(), Health.of("connection refused")))
    w._judge(None, proxy, Look(RunState.up(), Health.of("connection refused")))
    assert said == ["LOST proxy on a: unhealthy (connection refused), 0 s into measure 512"]


def test_a_restart_between_two_looks_is_a_loss_then_a_return(seen: tuple[Watch, list[str], Any]) -> None:
    w, said, decode = seen
    mark = w.begin("measure 512")
    w._judge(None, decode, Look(RunState.up(), HEALTHY))
    # the supervisor restarted it and it answers already: the count says it ended in between
    w._judge(None, decode, Look(RunState.up(1, last_exit=137), HEALTHY))
    assert said == ["LOST decode-0 on b: running, restarted 1x (last exit 137), 0 s into measure 512"]
    assert w.back_since("decode-0", mark) is None
    w._judge(None, decode, Look(RunState.up(1, last_exit=137), HEALTHY))
    assert said[-1] == "BACK decode-0 on b: running, restarted 1x (last exit 137), healthy"
    back = w.back_since("decode-0", mark)
    assert back is not None and back >= mark
    w._judge(None, decode, Look(RunState.up(1, last_exit=137), HEALTHY))  # nothing new
    assert len(said) == 2


def test_restarting_is_a_death_reported_at_once(seen: tuple[Watch, list[str], Any]) -> None:
    w, said, decode = seen
    w.begin("measure 512")
    w._judge(None, decode, Look(RunState.up(), HEALTHY))
    w._judge(None, decode, Look(RunState.restarting(137, 0, 3), NOT_ASKED))
    assert said == ["LOST decode-0 on b: exited (137), restarting (1 of 3), 0 s into measure 512"]
    w._judge(None, decode, Look(RunState.up(1, last_exit=137), Health.of("connection refused")))
    assert len(said) == 1  # lost already; starting up
    w._judge(None, decode, Look(RunState.up(1, last_exit=137), HEALTHY))
    assert said[-1].startswith("BACK decode-0 on b: running, restarted 1x")


def test_an_unreachable_node_between_two_looks_is_not_taken_for_a_restart(
    seen: tuple[Watch, list[str], Any],
) -> None:
    w, said, decode = seen
    w.begin("measure 512")
    w._judge(None, decode, Look(RunState.up(2, last_exit=137), HEALTHY))
    w._judge(None, decode, Look(RunState(Kind.unreachable), UNKNOWN))  # one look: not yet a loss
    w._judge(None, decode, Look(RunState.up(2, last_exit=137), HEALTHY))
    assert said == []  # the count it had before the node went quiet is the count it has
    w._judge(None, decode, Look(RunState.up(3, last_exit=137), HEALTHY))
    assert said == ["LOST decode-0 on b: running, restarted 3x (last exit 137), 0 s into measure 512"]
