"""The fixtures every test folder shares (a pytest plugin: tests/conftest.py loads it).

- `hosts`: test hosts in network namespaces with sshd, for one module; 4 of them, or what the
  module's `HOSTS` says: a count, or `cluster()`'s options (`{"count": 2, "containers": True}`).
- `site`: a real Slurm on two test hosts, for one module; the module's `SLURM_SITE` passes
  `slurm_or_skip`'s options (`{"gpus": 2}`, `{"oci": True}`).
- modules that drive one daemon of this machine (`SHARES`) run one at a time across test workers;
- modules whose bounds a busy CPU breaks (`QUIET`) run while no end-to-end module (real engines)
  does, in any test process of this machine.

And for every module, what it left running (tests/support/leftovers.py), listed in the summary.
"""

from __future__ import annotations

import fcntl
import os
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from tests.support import leftovers
from tests.support.netns import Cluster, cluster_or_skip
from tests.support.slurm import Site, slurm_or_skip


def _options(request: pytest.FixtureRequest, name: str, default: dict[str, Any]) -> dict[str, Any]:
    value = getattr(request.module, name, default)
    return {"count": value} if isinstance(value, int) else dict(value)


@pytest.fixture(scope="module")
def hosts(request: pytest.FixtureRequest) -> Iterator[Cluster]:
    with cluster_or_skip(**_options(request, "HOSTS", {"count": 4})) as c:
        yield c


@pytest.fixture(scope="module")
def site(request: pytest.FixtureRequest) -> Iterator[Site]:
    with cluster_or_skip(2) as hosts, slurm_or_skip(hosts, **_options(request, "SLURM_SITE", {})) as slurm:
        yield Site(hosts, slurm)


@pytest.fixture(scope="module", autouse=True)
def _one_module_per_daemon(request: pytest.FixtureRequest) -> Iterator[None]:
    """Modules that drive one daemon of this machine (the module's `SHARES`: "gluster" for
    glusterd, whose volume commands take one lock machine-wide; "containers" for podman, docker
    and their cgroups) take turns when several test workers run them (`pytest -n N`; scripts/test.sh
    runs them one at a time), or two test runs at once: one waits here for the other's module."""
    shared = getattr(request.module, "SHARES", None)
    if shared is None:
        yield
        return
    with open(f"/tmp/ucmctl-test-{shared}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


@pytest.fixture(scope="module", autouse=True)
def _quiet_or_heavy(request: pytest.FixtureRequest) -> Iterator[None]:
    """A `QUIET` module (the network filesystem's fault tests: store waits bounded at seconds,
    which GlusterFS missed on a healthy volume while a real vLLM kept both cores busy) holds the
    machine's quiet lock alone; an end-to-end module (tests/e2e: real engines) holds it shared.
    So neither waits for the other's kind unless both would run at once (scripts/test.sh's lanes
    run them at different times)."""
    quiet = bool(getattr(request.module, "QUIET", False))
    heavy = request.module.__name__.startswith("tests.e2e.")
    if not (quiet or heavy):
        yield
        return
    with open("/tmp/ucmctl-test-quiet.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX if quiet else fcntl.LOCK_SH)
        yield


LEFT: dict[str, dict[int, str]] = {}


def pytest_configure(config: pytest.Config) -> None:
    os.environ[leftovers.SESSION] = uuid.uuid4().hex


@pytest.fixture(scope="module", autouse=True)
def _leftovers(request: pytest.FixtureRequest) -> Iterator[None]:
    """Set up before and torn down after every other fixture of the module: what it left running."""
    before = leftovers.pids()
    yield
    if found := leftovers.left_behind(before):
        LEFT[request.module.__name__] = found


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if not LEFT:
        return
    terminalreporter.section("processes left running by a test module")
    for module, found in LEFT.items():
        for pid, line in sorted(found.items()):
            terminalreporter.write_line(f"{module}: {pid} {line[:200]}")
