"""The event loop the load generator runs on: uvloop where it is installed (vLLM depends on it,
so every machine that runs vLLM has it), asyncio's own otherwise or when the environment says
`UCMCTL_EVENT_LOOP=asyncio`. uvloop spends less of the CPU per request, which a replay's send
lag feels on a busy machine; the results say which loop ran (`provenance.event_loop`)."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Coroutine
from types import ModuleType
from typing import Any, TypeVar

T = TypeVar("T")


def _uvloop() -> ModuleType | None:
    if os.environ.get("UCMCTL_EVENT_LOOP", "").strip().lower() == "asyncio":
        return None
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop


def name() -> str:
    """The loop `run` uses, with its version: 'uvloop 0.23.0' or 'asyncio'."""
    uv = _uvloop()
    return "asyncio" if uv is None else f"uvloop {uv.__version__}"


def run(coro: Coroutine[Any, Any, T]) -> T:
    """`asyncio.run(coro)` on the loop `name()` says."""
    uv = _uvloop()
    runner: Callable[[Coroutine[Any, Any, T]], T] = asyncio.run if uv is None else uv.run
    return runner(coro)
