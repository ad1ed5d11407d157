"""A process's state as a value: what ucmctl's supervisor, a systemd unit or a container runtime
answers becomes a `RunState`, and its words are the ones `status` and the watch print."""

from __future__ import annotations

import pytest

from ucmctl.nodes.containers import ContainerState
from ucmctl.nodes.lifecycle import Supervised
from ucmctl.nodes.run_state import Kind, RunState


@pytest.mark.parametrize(
    ("state", "words"),
    [
        (RunState.up(), "running"),
        (RunState.up(2), "running, restarted 2x"),
        (RunState.up(2, last_exit=137), "running, restarted 2x (last exit 137)"),
        (RunState.up(0, last_exit=137), "running"),  # no restart: no last exit to tell
        (RunState.exited(137), "exited (137)"),
        (RunState.exited(1, 3), "exited (1), restarted 3x"),
        (RunState.restarting(137, 1, 3), "exited (137), restarting (2 of 3)"),
        (RunState.gave_up(137, 3), "exited (137) after 3 restarts"),
        (RunState.other("paused"), "paused"),
        (RunState.other("created", 1), "created, restarted 1x"),
        (RunState(Kind.stopped, 2), "stopped"),
        (RunState(Kind.no_container), "stopped (no container)"),
        (RunState(Kind.not_running), "not running"),
        (RunState(Kind.unreachable), "node unreachable"),
    ],
)
def test_each_state_has_its_words(state: RunState, words: str) -> None:
    assert state.words() == words
    assert state.running == (state.kind is Kind.running)


@pytest.mark.parametrize(
    ("told", "running", "state"),
    [
        (Supervised(1, 137, "waiting"), True, RunState.restarting(137, 1, 3)),
        (Supervised(1, 137, "waiting"), False, RunState(Kind.stopped, 1)),  # its supervisor ended with it
        (Supervised(1, 137, "waiting", by_systemd=True), False, RunState.restarting(137, 1, 3)),
        (Supervised(2, 137, "running"), True, RunState.up(2, last_exit=137)),
        (Supervised(2, 137, "running", by_systemd=True), True, RunState.up(2)),
        (Supervised(3, 137, "gave-up"), False, RunState.gave_up(137, 3)),
        (Supervised(0, 0, "done"), False, RunState(Kind.stopped)),
        (Supervised(1, 143, "stopped"), False, RunState(Kind.stopped, 1)),
    ],
)
def test_what_restarts_a_process_says_is_its_state(told: Supervised, running: bool, state: RunState) -> None:
    assert told.run_state(running, 3) == state
    assert state.restarts == told.restarts  # the count `status` adds up, whatever the state


@pytest.mark.parametrize(
    ("runtime", "state"),
    [
        ("running", RunState.up(1)),
        ("exited", RunState.exited(137, 1)),
        ("stopped", RunState.exited(137, 1)),  # podman's word until its cleanup ran
        ("paused", RunState.other("paused", 1)),
    ],
)
def test_what_the_runtime_says_of_a_container_is_its_state(runtime: str, state: RunState) -> None:
    assert ContainerState("decode-0", runtime, 137, 42, 1).run_state() == state
