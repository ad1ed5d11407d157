"""The deployment's proxy as ucmctl drives it: its /instances routes (add, remove, drain,
resume, what each instance has in flight)."""

from __future__ import annotations

import json
import os
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any

from ucmctl.core.errors import ExitStatus, UcmctlError
from ucmctl.plan.model import Process

API_KEY_ENV = "UCMCTL_PROXY_API_KEY"  # the proxy's own key, when it has one (ucmctl.proxy.config)


@dataclass(frozen=True)
class Drain:
    """How a server leaves routing for a restart or a scale-down: `move_after` seconds on, the
    answers it streams move to other instances (they go on from the store; None: they are
    waited for); what is still in flight `timeout` seconds on is cut."""

    timeout: float = 60.0
    move_after: float | None = 2.0


class Proxy:
    """The deployment's proxy, over its /instances routes."""

    def __init__(self, url: str) -> None:
        self.url = url.rstrip("/")

    def _ask(self, path: str, body: dict[str, Any] | None = None, timeout: float = 10) -> dict[str, object]:
        """GET (or POST `body` to) `path`; its JSON answer. The proxy's API key, when it has
        one, comes from UCMCTL_PROXY_API_KEY here too."""
        headers = {"Content-Type": "application/json"}
        key = os.environ.get(API_KEY_ENV)
        if key:
            headers["Authorization"] = f"Bearer {key}"
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.url + path, data=data, headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                return dict(json.loads(r.read()))
        except (urllib.error.URLError, OSError, ValueError) as exc:
            raise UcmctlError.one(
                f"the proxy at {self.url} did not answer {path}: {exc}",
                status=ExitStatus.FAILURE,
                fix="check `ucmctl status`",
            ) from None

    def drain(self, server: Process, how: Drain) -> None:
        """Out of routing; its streamed answers moved elsewhere after `how.move_after`."""
        body: dict[str, Any] = {"url": str(server.url), "role": server.role}
        if how.move_after is not None:
            body["move_after"] = how.move_after
        self._ask("/instances/drain", body)

    def resume(self, server: Process) -> None:
        self._ask("/instances/resume", {"url": str(server.url), "role": server.role})

    def wait_routed(self, server: Process, timeout: float) -> bool:
        """Whether the proxy routes to `server` (its health loop found it healthy, not draining,
        not stalled) within `timeout` s."""
        deadline = time.monotonic() + timeout
        while True:
            if any(i["url"] == server.url and _routed(i) for i in self._listed()):
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.2)

    def add(self, server: Process) -> None:
        self._ask("/instances/add", {"url": str(server.url), "role": server.role})

    def remove(self, server: Process) -> None:
        self._ask("/instances/remove", {"url": str(server.url), "role": server.role})

    def _listed(self) -> list[dict[str, object]]:
        listed = self._ask("/instances").get("instances")
        return [i for i in listed if isinstance(i, dict)] if isinstance(listed, list) else []

    def in_flight(self, server: Process) -> int:
        """The server's requests in flight at the proxy."""
        return sum(int(str(i["requests_in_flight"])) for i in self._listed() if i["url"] == server.url)

    def routed(self, role: str, besides: set[str]) -> int:
        """How many instances of `role` the proxy routes to, those at `besides` not counted."""
        return sum(1 for i in self._listed() if i["role"] == role and _routed(i) and i["url"] not in besides)


def _routed(listed: dict[str, object]) -> bool:
    """Whether the proxy routes to an instance it lists: healthy, neither drained nor stalled."""
    return bool(listed["healthy"]) and not listed["draining"] and not listed.get("stalled")


class Proxies:
    """The deployment's proxy, or every one of its replicas: each is told the same, as each
    keeps its own instance list; what they carry is added up."""

    def __init__(self, urls: list[str]) -> None:
        self.each = [Proxy(u) for u in urls]

    def drain(self, server: Process, how: Drain) -> int:
        """Out of every replica's routing (its streamed answers moved elsewhere after
        `how.move_after`), then wait up to `how.timeout` s for its requests in flight; how many
        are still in flight then."""
        t0 = time.monotonic()
        self.in_flight(server)  # every replica answers before any is told: none drained alone
        for proxy in self.each:
            proxy.drain(server, how)
        while (left := self.in_flight(server)) and time.monotonic() - t0 < how.timeout:
            time.sleep(0.2)
        return left

    def resume(self, server: Process) -> None:
        for proxy in self.each:
            proxy.resume(server)

    def add(self, server: Process) -> None:
        for proxy in self.each:
            proxy.add(server)

    def remove(self, server: Process) -> None:
        for proxy in self.each:
            proxy.remove(server)

    def wait_routed(self, server: Process, timeout: float) -> bool:
        """Whether every replica routes to `server` within `timeout` s."""
        deadline = time.monotonic() + timeout
        return all(proxy.wait_routed(server, max(0.0, deadline - time.monotonic())) for proxy in self.each)

    def in_flight(self, server: Process) -> int:
        return sum(proxy.in_flight(server) for proxy in self.each)

    def routed(self, role: str, besides: set[str]) -> int:
        """How many instances of `role` the replica that routes to the fewest routes to."""
        return min(proxy.routed(role, besides) for proxy in self.each)


def routing_line(proxy: Process) -> str | None:
    """What `status` says of the proxy's routing: the policy, and for kv where it learns where
    the KV is and its speeds (GET /routing); None when the proxy does not answer (its row says
    why) or has no spec (a record of an older ucmctl)."""
    if proxy.proxy is None or proxy.url is None:
        return None
    try:
        got = Proxy(proxy.url)._ask("/routing", timeout=2)
    except UcmctlError:
        return None
    line = f"{proxy.name} routing: {got.get('policy', proxy.proxy.routing)}"
    if proxy.proxy.roles == "dynamic":
        line += ", roles per request"
    if proxy.proxy.direct_below:
        line += f", straight to decode below {proxy.proxy.direct_below} tokens to compute"
    moves = proxy.proxy.migrations
    if moves != 3:  # the default goes without saying
        line += f", a cut answer moves {moves}x at most" if moves else ", cut answers end (migrations 0)"
    stall = proxy.proxy.stall_timeout
    if stall != 30.0:
        line += f", a server silent {stall:g} s is out" if stall else ", no stall watch"
    if "index" in got:
        line += f"; index: {got['index']}, {got.get('blocks', 0)} blocks{_events_read(got)}"
        for leg in ("prefill", "load"):
            speed = got.get(leg)
            if isinstance(speed, dict):
                how = f"measured ({speed.get('samples')} legs)" if speed.get("measured") else "prior"
                per = 1e3 * float(speed.get("seconds_per_token") or 0.0)
                line += f"; {leg} {per:.3g} ms/token, {how}"
        tokenization = got.get("tokenization")
        if isinstance(tokenization, dict):
            line += f"; text prompts' tokens: {tokenization.get('source')}"
    return line


def _events_read(got: dict[str, Any]) -> str:
    """What the proxy's KV-event feeds read, all servers together ("" without feeds)."""
    feeds = got.get("kv_events")
    if not isinstance(feeds, list) or not feeds:
        return ""
    read, gaps, bad = (sum(int(f.get(k, 0)) for f in feeds) for k in ("events", "gaps", "bad"))
    silent = sum(1 for f in feeds if not f.get("batches"))  # unreachable, or nothing sent yet
    unheard = f", {silent} of {len(feeds)} servers not heard from" if silent else ""
    return f" ({read} events read, {gaps} batches missed, {bad} malformed{unheard})"
