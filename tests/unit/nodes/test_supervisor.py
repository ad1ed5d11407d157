"""ucmctl's supervisor (restart: on-failure on a node without a runtime of its own): the rendered
supervise.sh runs for real under lifecycle.start. A failing server is started again at most
max_restarts times, a clean end is not restarted, a SIGKILL to the server (what `bench --fault
kill:` sends) is restarted while `down`'s TERM to the group ends everything with no restart."""

from __future__ import annotations

from pathlib import Path

from tests.support.processes import wait_for
from ucmctl.launch.nodes import NodeLauncher
from ucmctl.nodes import lifecycle
from ucmctl.nodes.executor import LocalExecutor
from ucmctl.nodes.run_state import Kind, RunState
from ucmctl.plan.model import NodePlan, PlacedFile, Process, RestartPlan, Stage
from ucmctl.plan.render import render


def _supervised(tmp: Path, script: str, max_restarts: int = 2) -> tuple[LocalExecutor, Process]:
    home = tmp / "srv"
    home.mkdir()
    launch, supervise, state = home / "launch.sh", home / "supervise.sh", home / "restarts"
    launch.write_text(script)
    supervise.write_text(render("supervise.sh.j2", deployment="d", process="srv", launch=str(launch),
                                state=str(state), max_restarts=max_restarts, backoff_s="0.2"))  # fmt: skip
    node = NodePlan(name="local", host="localhost", transport="local", user="me", ssh_port=22,
                    key=None, platform="cpu", devices=0, python="python3", run_dir=str(tmp),
                    bind="127.0.0.1")  # fmt: skip
    restart = RestartPlan(by="supervisor", max_restarts=max_restarts, backoff_s=0.2, state=str(state))
    p = Process(name="srv", role="decode", node="local", stage=Stage.servers, argv=["true"], env={},
                launch=str(supervise), files=[PlacedFile(path=str(supervise), content="")], ports={},
                log=str(home / "output.log"), pidfile=str(home / "pid"), health_timeout=60.0,
                restart=restart)  # fmt: skip
    return LocalExecutor(node), p


def test_a_failing_server_is_restarted_at_most_max_restarts_times(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    ex, p = _supervised(tmp_path, f"echo run >> {runs}\nexit 3\n")
    lifecycle.start(ex, p)
    assert wait_for(lambda: lifecycle.alive(ex, p) is None)
    assert runs.read_text().count("run") == 3  # the first start and 2 restarts
    s = lifecycle.supervised(ex, p)
    assert s is not None and (s.restarts, s.last_exit, s.what) == (2, 3, "gave-up")
    assert s.run_state(False, 2) == RunState.gave_up(3, 2)
    assert s.run_state(False, 2).words() == "exited (3) after 2 restarts"
    assert "restart 2 of 2 in 0.2 s" in (tmp_path / "srv" / "output.log").read_text()


def test_a_clean_end_is_not_restarted(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    ex, p = _supervised(tmp_path, f"echo run >> {runs}\nexit 0\n")
    lifecycle.start(ex, p)
    assert wait_for(lambda: lifecycle.alive(ex, p) is None)
    assert runs.read_text().count("run") == 1
    s = lifecycle.supervised(ex, p)
    assert s is not None and (s.restarts, s.what) == (0, "done")


def test_a_killed_server_comes_back_and_down_ends_it_for_good(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    ex, p = _supervised(tmp_path, f"echo run >> {runs}\nexec sleep 60\n")
    launcher = NodeLauncher.__new__(NodeLauncher)  # only its signal/run_state, on this executor
    launcher._executors = {"local": ex}
    lifecycle.start(ex, p)
    assert wait_for(lambda: runs.exists())
    assert lifecycle.supervised(ex, p) is None  # no end yet
    assert launcher.run_state(p) == RunState.up()
    assert launcher.signal(p, "KILL")  # the server, not its supervisor
    assert wait_for(lambda: runs.read_text().count("run") == 2)
    s = lifecycle.supervised(ex, p)
    assert s is not None and (s.restarts, s.last_exit, s.what) == (1, 137, "running")
    assert launcher.run_state(p) == RunState.up(1, last_exit=137)
    assert launcher.run_state(p).words() == "running, restarted 1x (last exit 137)"
    assert lifecycle.alive(ex, p) is not None
    stopped = lifecycle.stop(ex, p, grace=5)  # what `down` does: TERM to the group
    assert stopped.was_running and not stopped.killed

    def ended() -> bool:  # the supervisor's last word, written as it ends: no restart after it
        last = lifecycle.supervised(ex, p)
        return last is not None and last.what not in ("running", "waiting")

    assert wait_for(ended)
    assert runs.read_text().count("run") == 2  # not restarted
    assert lifecycle.alive(ex, p) is None
    s = lifecycle.supervised(ex, p)
    assert s is not None and s.what == "stopped"
    assert launcher.run_state(p) == RunState(Kind.stopped, 1)
