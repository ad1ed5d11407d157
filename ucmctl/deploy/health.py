"""Health gates: a process is up when each of its health URLs answers 200, in order."""

from __future__ import annotations

import contextlib
import time
import urllib.request
from collections.abc import Callable


def probe(url: str, timeout: float = 2.0) -> bool:
    with contextlib.suppress(OSError, ValueError), urllib.request.urlopen(url, timeout=timeout) as r:
        return bool(r.status == 200)
    return False


def wait_healthy(
    urls: list[str],
    *,
    timeout: float,
    still_alive: Callable[[], bool],
    interval: float = 0.5,
    alive_every: float = 2.0,
    cancelled: Callable[[], bool] = lambda: False,
) -> str | None:
    """None when every URL answered; else why not (the process died, or time ran out)."""
    deadline = time.monotonic() + timeout
    # The first look at the process only after `alive_every` (a look may be a round trip to its
    # node): most processes answer before that, and one that died is still found within seconds.
    next_alive_check = time.monotonic() + alive_every
    for url in urls:
        while not probe(url):
            if cancelled():
                return "interrupted"
            now = time.monotonic()
            if now >= next_alive_check:
                if not still_alive():
                    return "the process exited before it became healthy"
                next_alive_check = now + alive_every
            if now > deadline:
                return f"{url} did not answer within {timeout:.0f} s"
            time.sleep(interval)
    return None
