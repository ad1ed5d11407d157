"""Health gates: a process is up when each of its health URLs answers 200, in order.

URLs are probed from the machine that runs ucmctl: when one never answers, the reason of the
last try is kept, and a timeout or unreachable network (not a refused port) says so, since a
node's ports firewalled from here look just like a server that hangs.
"""

from __future__ import annotations

import http.client
import socket
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum

# Reasons that point at the network between this machine and the node, not at the server.
_NETWORK = ("timed out", "no route to host", "network is unreachable", "name not resolved")


class HealthKind(Enum):
    healthy = "healthy"
    unhealthy = "unhealthy"
    not_asked = "not asked"  # a process that does not run, or has no health URL
    unknown = "unknown"  # its node did not answer


@dataclass(frozen=True)
class Health:
    """What a process's health URL answered, as `status` and the watch judge it; words only
    for display."""

    kind: HealthKind
    reason: str | None = None  # why unhealthy, as `why_not` says it ("HTTP 503", "timed out")

    @classmethod
    def of(cls, reason: str | None) -> Health:
        """From `why_not`'s answer: None is healthy."""
        return cls(HealthKind.healthy) if reason is None else cls(HealthKind.unhealthy, reason)

    @property
    def unhealthy(self) -> bool:
        return self.kind is HealthKind.unhealthy

    @property
    def answered(self) -> bool:
        """Unhealthy, but the server answered with an HTTP status (it runs and says no)."""
        return self.unhealthy and (self.reason or "").startswith("HTTP ")

    def words(self) -> str:
        if self.kind is HealthKind.unhealthy:
            return f"unhealthy ({self.reason})"
        return {HealthKind.healthy: "healthy", HealthKind.not_asked: "-", HealthKind.unknown: "?"}[self.kind]


HEALTHY = Health(HealthKind.healthy)
NOT_ASKED = Health(HealthKind.not_asked)
UNKNOWN = Health(HealthKind.unknown)


def why_not(url: str, timeout: float = 2.0) -> str | None:
    """None when `url` answers 200; else why not, in a few words."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return None if r.status == 200 else f"HTTP {r.status}"
    except urllib.error.HTTPError as exc:
        return f"HTTP {exc.code}"
    except urllib.error.URLError as exc:
        return _os_reason(exc.reason)
    except (OSError, http.client.HTTPException) as exc:
        return _os_reason(exc)
    except ValueError:
        return "not a valid URL"


def _os_reason(exc: object) -> str:
    if isinstance(exc, TimeoutError | socket.timeout):
        return "timed out"
    if isinstance(exc, socket.gaierror):
        return "name not resolved"
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused"
    if isinstance(exc, ConnectionResetError):
        return "connection reset"
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror.lower()
    if isinstance(exc, http.client.HTTPException):
        return "no valid HTTP answer"
    return str(exc) or type(exc).__name__


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
        while (last := why_not(url)) is not None:
            if cancelled():
                return "interrupted"
            now = time.monotonic()
            if now >= next_alive_check:
                if not still_alive():
                    return "the process exited before it became healthy"
                next_alive_check = now + alive_every
            if now > deadline:
                return _timed_out(url, timeout, last)
            time.sleep(interval)
    return None


def _timed_out(url: str, timeout: float, last: str) -> str:
    reason = f"{url} did not answer 200 within {timeout:.0f} s (last try from this machine: {last})"
    if last in _NETWORK:
        where = urllib.parse.urlsplit(url)
        reason += (
            f"; the process is running, so check that this machine can reach {where.hostname} "
            f"port {where.port}: ucmctl probes health from where it runs"
        )
    return reason
