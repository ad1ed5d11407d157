"""Fixtures for end-to-end tests against a real `vllm serve` on the CPU.

A real engine costs ~45 s to start here, so a test that needs a plain one (no connector) takes
the shared `plain_vllm` rather than starting its own; a test whose server must differ (a
connector, prefix caching on, another dtype) starts its own. The tests that share the server
run one after another (collection moves them next to the first of them, in their order), and the
server stops after the last of them, so it does not idle beside the other modules' servers.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.vllm_server import VllmServer

PLAIN = "plain_vllm"
_plain: list[VllmServer] = []  # the shared server once started, for the early stop below
_last_user: list[str] = []  # the node id of the last test that uses it


@pytest.fixture(scope="session")
def e2e_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("e2e")


@pytest.fixture(scope="session")
def compile_cache(e2e_root: Path) -> Path:
    # One torch.compile cache for every server of the session: later starts reuse it.
    path = Path(os.environ.get("UCM_E2E_COMPILE_CACHE", e2e_root / "vllm-cache"))
    path.mkdir(parents=True, exist_ok=True)
    return path


@pytest.fixture(scope="session")
def tiny_model(e2e_root: Path) -> Path:
    from ucmctl.tinymodel import make_model

    return make_model(e2e_root / "tiny", size="tiny", seed=0)


@pytest.fixture(scope="session")
def plain_vllm(e2e_root: Path, tiny_model: Path, compile_cache: Path) -> Iterator[VllmServer]:
    """One real `vllm serve` without a connector: bfloat16, eager, 2048 tokens, prefix caching
    off (a benchmark's repeated prompts must be computed, not found), 4 sequences at a time
    (test_bench_vs_vllm's concurrency; n=2 requests fit), blocks of 128 tokens (the CPU
    backend's default, named as test_sim_vs_vllm named it). Its users: test_bench_vs_vllm (both
    benchmark clients) and test_sim_vs_vllm (the protocol assertions, which no flag here touches).
    Requests leave nothing behind: every one completes, and nothing is cached between them."""
    from tests.support.bench_vs_vllm import CONCURRENCY

    root = e2e_root / "plain"
    root.mkdir()
    server = VllmServer(
        tiny_model,
        root / "vllm.log",
        compile_cache,
        eager=True,
        in_process_worker=True,  # see VllmServer.in_process_worker
        dtype="bfloat16",
        max_model_len=2048,
        extra_args=["--no-enable-prefix-caching", "--max-num-seqs", str(CONCURRENCY), "--block-size", "128"],
    )
    _plain.append(server)
    try:
        yield server.start().wait_ready(600)
    finally:
        server.stop()  # the process group, and the TMPDIR with vLLM's sockets


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    users = [item for item in items if PLAIN in getattr(item, "fixturenames", ())]
    if not users:
        return
    first = items.index(users[0])
    shared = set(users)
    rest = [item for item in items if item not in shared]
    items[:] = rest[:first] + users + rest[first:]
    _last_user[:] = [users[-1].nodeid]


def pytest_runtest_teardown(item: pytest.Item) -> None:
    """Stop the shared server after its last user in the collected order (a run of a subset,
    as under xdist, that never reaches it stops the server at the session's end instead)."""
    if _plain and [item.nodeid] == _last_user:
        _plain.pop().stop()
