"""The load generator's event loop: uvloop where installed, asyncio's when asked; the results
name the one that ran."""

from __future__ import annotations

import asyncio

import pytest

from ucmctl.bench import loop, provenance


async def running_loop_module() -> str:
    return type(asyncio.get_running_loop()).__module__


def test_uvloop_runs_where_it_is_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    uvloop = pytest.importorskip("uvloop")
    monkeypatch.delenv("UCMCTL_EVENT_LOOP", raising=False)
    assert loop.name() == f"uvloop {uvloop.__version__}"
    assert loop.run(running_loop_module()).startswith("uvloop")
    assert provenance.provenance()["event_loop"] == loop.name()


@pytest.mark.parametrize("value", ["asyncio", " AsyncIO "])
def test_the_environment_chooses_asyncio(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv("UCMCTL_EVENT_LOOP", value)
    assert loop.name() == "asyncio"
    assert loop.run(running_loop_module()) == "asyncio.unix_events"
    assert provenance.provenance()["event_loop"] == "asyncio"


def test_run_returns_the_coroutines_value_and_raises_its_error() -> None:
    async def value() -> int:
        await asyncio.sleep(0)
        return 42

    async def fails() -> None:
        raise ValueError("boom")

    assert loop.run(value()) == 42
    with pytest.raises(ValueError, match="boom"):
        loop.run(fails())
