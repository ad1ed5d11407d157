"""One error root: every error ucmctl raises for a user is a UcmctlError, reported in one place."""

from __future__ import annotations

import pickle

import pytest

from ucmctl.core.errors import ExitStatus, Problem, UcmctlError, report
from ucmctl.core.ucm_config import UcmConfigError
from ucmctl.launch.base import LaunchError
from ucmctl.launch.slurm import SlurmError
from ucmctl.nodes.executor import HostKeyError, NodeError


@pytest.mark.parametrize(
    ("error", "line", "status"),
    [
        (NodeError("h1", "unreachable: timed out"), "node h1: unreachable: timed out", ExitStatus.FAILURE),
        (HostKeyError("h1", "host key changed"), "node h1: host key changed", ExitStatus.FAILURE),
        (LaunchError("sbatch refused", ExitStatus.NOT_READY), "sbatch refused", ExitStatus.NOT_READY),
        (SlurmError("squeue failed: x"), "squeue failed: x", ExitStatus.FAILURE),
        (UcmConfigError("kind: invalid 'x'"), "kind: invalid 'x'", ExitStatus.BAD_INPUT),
        (UcmctlError.one("bad", file="t.yaml", line=3, key="nodes.a", fix="fix it"),
         "t.yaml:3 nodes.a: bad (fix it)", ExitStatus.BAD_INPUT),
    ],
)  # fmt: skip
def test_every_error_is_one_line_and_a_status(error: UcmctlError, line: str, status: ExitStatus) -> None:
    assert isinstance(error, UcmctlError)
    assert report(error) == ([line], status)
    assert str(error) == line
    copy = pickle.loads(pickle.dumps(error))  # as a worker process hands it back
    assert type(copy) is type(error) and report(copy) == ([line], status)


def test_config_errors_are_still_value_errors() -> None:
    assert isinstance(UcmConfigError("x"), ValueError)


def test_several_problems_are_several_lines() -> None:
    error = UcmctlError([Problem("one", file="a.yaml"), Problem("two", key="k")], ExitStatus.NOT_READY)
    assert report(error) == (["a.yaml: one", "k: two"], ExitStatus.NOT_READY)


def test_a_file_error_is_bad_input_and_a_bug_is_not_reported() -> None:
    assert report(FileNotFoundError(2, "No such file or directory", "/x/y.json")) == (
        ["/x/y.json: No such file or directory"], ExitStatus.BAD_INPUT,
    )  # fmt: skip
    assert report(KeyError("x")) is None
