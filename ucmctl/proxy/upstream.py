"""How a leg to an upstream instance fails: the exchange's own errors and the failure that becomes
the client's error response."""

from __future__ import annotations

import asyncio

import aiohttp

# errors of the upstream exchange itself (not of the client's side)
UPSTREAM_ERRORS = (aiohttp.ClientError, asyncio.TimeoutError)


class LegFailed(Exception):
    """No instance could serve a leg; becomes the client's error response."""

    def __init__(self, status: int, message: str, reason: str) -> None:
        super().__init__(message)
        self.status, self.message, self.reason = status, message, reason


def why(exc: BaseException) -> str:
    """An exception in a few words: its first line, at most 200 characters."""
    text = str(exc) or type(exc).__name__
    return text.splitlines()[0][:200] if text else type(exc).__name__
