"""Fixtures of the proxy's integration tests: simulator instances and proxies, killed at teardown."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from .procs import Proc, pd_flags, proxy, sim, start_all


@pytest.fixture
def procs() -> Iterator[list[Proc]]:
    """Processes a test starts; all are killed when it ends."""
    started: list[Proc] = []
    yield started
    for p in started:
        p.kill()


@pytest.fixture
def launch(procs: list[Proc], tmp_path: Path) -> Callable[..., list[Proc]]:
    """Start sims/proxies (described by the helpers in procs.py) and register them for teardown."""

    def go(*items: Proc, proxies_ready: str = "/health") -> list[Proc]:
        procs.extend(items)
        start_all(*items, proxies_ready=proxies_ready)
        return list(items)

    return go


class PD:
    """Two prefill and two decode sims behind a pd proxy and a p2p pd proxy (shared by a module)."""

    def __init__(self, tmp: Path) -> None:
        self.prefill = [sim(tmp), sim(tmp)]
        self.decode = [sim(tmp), sim(tmp)]
        self.proxy = proxy(tmp, *pd_flags(self.prefill, self.decode))
        self.p2p = proxy(tmp, *pd_flags(self.prefill[:1], self.decode[:1]), "--p2p", "ascend")
        self.all = [*self.prefill, *self.decode, self.proxy, self.p2p]


@pytest.fixture(scope="module")
def pd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PD]:
    """A running 2P2D set-up (zero-cost sims)."""
    setup = PD(tmp_path_factory.mktemp("pd"))
    try:
        start_all(*setup.all)
        yield setup
    finally:
        for p in setup.all:
            p.kill()
