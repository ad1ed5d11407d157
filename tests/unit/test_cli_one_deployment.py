"""`bench`, `down`, `logs` and `status` with no deployment named; errors at the CLI boundary as
one line each with an exit status a CI can act on."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.support.cli import Cli
from ucmctl import cli
from ucmctl.core.errors import ExitStatus
from ucmctl.deploy.state import Record, StateStore
from ucmctl.nodes.executor import NodeError
from ucmctl.plan.build import build_plan
from ucmctl.topology.load import load_topology

TOPOLOGY = Path(__file__).resolve().parents[2] / "topologies" / "2p2d-centralized.yaml"


def home_with(tmp: Path, *names: str) -> Path:
    home = tmp / "home"
    store = StateStore(home / "deployments")
    plan = build_plan(load_topology(TOPOLOGY))
    for name in names:
        store.save(Record(deployment=name, topology_path=str(TOPOLOGY), topology_digest=plan.topology_digest,
                          plan=plan, status="up"))  # fmt: skip
    return home


def ucmctl(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return Cli(home, timeout=60)(*args)


def one_line(done: subprocess.CompletedProcess[str]) -> str:
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    return lines[0]


@pytest.mark.parametrize(
    "args", [("down",), ("logs",), ("bench", "--prefix-ratio", "0.8"), ("bench",)], ids=lambda a: " ".join(a)
)
def test_none_up_is_one_line_and_exit_2(tmp_path: Path, args: tuple[str, ...]) -> None:
    done = ucmctl(home_with(tmp_path), *args)
    assert done.returncode == ExitStatus.BAD_INPUT
    line = one_line(done)
    assert f"`ucmctl {args[0]}`: no deployment on this machine" in line and "ucmctl up TOPOLOGY" in line


@pytest.mark.parametrize(
    "args", [("down",), ("logs",), ("bench", "--prefix-ratio", "0.8")], ids=lambda a: a[0]
)
def test_several_up_are_listed_on_one_line(tmp_path: Path, args: tuple[str, ...]) -> None:
    done = ucmctl(home_with(tmp_path, "alpha", "beta"), *args)
    assert done.returncode == ExitStatus.BAD_INPUT
    line = one_line(done)
    assert "2 deployments on this machine: alpha, beta" in line, line


def test_status_without_a_name_lists_all_or_says_none(tmp_path: Path) -> None:
    done = ucmctl(home_with(tmp_path), "status")
    assert done.returncode == 0 and done.stdout.strip() == "no deployments"


def test_bench_deployment_and_url_together_is_bad_input(tmp_path: Path) -> None:
    done = ucmctl(home_with(tmp_path, "alpha"), "bench", "-d", "alpha", "--url", "http://127.0.0.1:1")
    assert done.returncode == ExitStatus.BAD_INPUT
    assert "--deployment and --url both given" in one_line(done)


def test_logs_of_an_unknown_process_of_the_one_deployment(tmp_path: Path) -> None:
    done = ucmctl(home_with(tmp_path, "alpha"), "logs", "alpha", "nope")
    assert done.returncode == ExitStatus.BAD_INPUT
    assert "no process nope in alpha" in one_line(done)


def _main_with(monkeypatch: pytest.MonkeyPatch, exc: BaseException) -> int:
    def app(**_: object) -> None:
        raise exc

    monkeypatch.setattr(cli, "app", app)
    with pytest.raises(SystemExit) as done:
        cli.main()
    return int(done.value.code or 0)


def test_a_node_error_is_one_line_at_the_boundary(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    code = _main_with(
        monkeypatch, NodeError("b", "ssh: connect to host 192.168.10.2 port 22: No route to host")
    )
    assert code == ExitStatus.FAILURE
    err = capsys.readouterr().err
    assert err.strip().splitlines() == [
        "error: node b: ssh: connect to host 192.168.10.2 port 22: No route to host"
    ]


def test_a_file_error_is_one_line_and_bad_input(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    code = _main_with(monkeypatch, FileNotFoundError(2, "No such file or directory", "/no/such/dir/r.json"))
    assert code == ExitStatus.BAD_INPUT
    assert capsys.readouterr().err.strip() == "error: /no/such/dir/r.json: No such file or directory"


def test_a_bug_keeps_its_traceback(monkeypatch: pytest.MonkeyPatch) -> None:
    def app(**_: object) -> None:
        raise ZeroDivisionError

    monkeypatch.setattr(cli, "app", app)
    with pytest.raises(ZeroDivisionError):
        cli.main()


def test_exit_statuses_are_distinct() -> None:
    codes = {s.name: int(s) for s in ExitStatus}
    assert codes["REGRESSION"] == 5 and codes["REQUESTS_FAILED"] == 6
    assert len(set(codes.values())) == len(codes)


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (("up",), "error: ucmctl up: Missing argument 'topology'. (see `ucmctl up --help`)"),
        (("bench", "--xyzzy"), "error: ucmctl bench: No such option: --xyzzy (see `ucmctl bench --help`)"),
        (("bench", "compare"), "error: ucmctl bench compare: Missing argument 'baseline'."),
    ],
    ids=["missing", "unknown", "sub"],
)
def test_usage_errors_are_one_line(tmp_path: Path, args: tuple[str, ...], line: str) -> None:
    done = ucmctl(home_with(tmp_path), *args)
    assert done.returncode == ExitStatus.BAD_INPUT
    assert one_line(done).startswith(line)
