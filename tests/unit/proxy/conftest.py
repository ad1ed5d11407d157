"""Helpers of the proxy's unit tests: the app in-process, upstreams on ports where nothing listens."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from ucmctl.proxy.app import make_app
from ucmctl.proxy.config import ProxyConfig


def closed_port() -> int:
    """A loopback port that nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def dead_url() -> str:
    """The URL of an instance that refuses connections."""
    return f"http://127.0.0.1:{closed_port()}"


@contextlib.asynccontextmanager
async def proxy_client(config: ProxyConfig) -> AsyncIterator[TestClient[Any, Any]]:
    """A client of the proxy app served in this event loop."""
    client = TestClient(TestServer(make_app(config)))
    await client.start_server()
    try:
        yield client
    finally:
        await client.close()


@pytest.fixture
def run() -> Callable[[Coroutine[Any, Any, Any]], Any]:
    """Run a coroutine to completion (no pytest-asyncio needed)."""
    return asyncio.run
