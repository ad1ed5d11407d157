"""The upstream instances the proxy knows and what it knows of each right now."""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Literal

from yarl import URL

ROLES = ("prefill", "decode", "mixed")
LoadKind = Literal["tokens", "requests"]


@dataclass(eq=False)
class Instance:
    """One upstream API server and what the proxy knows of it right now."""

    url: str
    role: str
    healthy: bool = True
    removed: bool = False
    draining: bool = False  # out of routing on purpose (a restart): its requests in flight finish
    stalled: bool = False  # out of routing: it streamed no token for the stall timeout (proxy/stall)
    requests: int = 0  # in flight
    tokens: int = 0  # prompt tokens in flight
    waiting: int = 0  # of those, the prompt tokens of legs that have not answered yet: work queued
    pending: int = 0  # of those, the legs that have not answered yet
    streaming: int = 0  # of those in flight, the answers whose first token went to the client
    consecutive_failures: int = 0
    requests_total: int = 0
    failures_total: int = 0
    stalls_total: int = 0
    output_chunks_total: int = 0
    epoch: int = 0  # times it came back into routing: what it cached before may be gone
    # the answers streaming from it that can go on elsewhere (flow's legs: `move()` each)
    answers: set[Any] = field(default_factory=set, repr=False)
    # every answer it streams (flow's legs), and when it last sent a token or an answer (the event
    # loop's clock)
    streams: set[Any] = field(default_factory=set, repr=False)
    output_at: float = 0.0
    # the waits there for an answer's headers or first bytes (each can be `close()`d: a stall
    # cuts them), and when each began
    first_waits: dict[Any, float] = field(default_factory=dict, repr=False)
    uid: int = field(default_factory=itertools.count().__next__)  # one per instance added, ever
    _urls: dict[str, URL] = field(default_factory=dict, repr=False)

    def endpoint(self, path: str) -> URL:
        """The URL of `path` on this instance, parsed once (yarl parsing is not free per request)."""
        url = self._urls.get(path)
        if url is None:
            url = self._urls[path] = URL(self.url + path)
        return url

    @property
    def routable(self) -> bool:
        """In routing now: healthy, not drained, not stalled."""
        return self.healthy and not self.draining and not self.stalled

    def cache_lost(self) -> None:
        """Its own cache is gone (it restarted, or cleared it): what it held before is not
        held now (the index keys holders by epoch)."""
        self.epoch += 1

    def acquire(self, tokens: int) -> None:
        """Count one request of `tokens` prompt tokens as in flight here, not answered yet."""
        self.requests += 1
        self.tokens += tokens
        self.waiting += tokens
        self.pending += 1
        self.requests_total += 1

    def answered(self, tokens: int) -> None:
        """The request counted by `acquire` answered (its first bytes, or a prefill's whole
        answer): its prompt is computed."""
        self.waiting -= tokens
        self.pending -= 1

    def release(self, tokens: int, *, answered: bool = True) -> None:
        """The request counted by `acquire` is over (`answered`: `answered` was said of it)."""
        self.requests -= 1
        self.tokens -= tokens
        if not answered:
            self.waiting -= tokens
            self.pending -= 1


class Pool:
    """Every instance by role and its state; which one takes a request is the router's
    (ucmctl.proxy.routing)."""

    def __init__(self, dynamic: bool = False) -> None:
        self.by_role: dict[str, list[Instance]] = {role: [] for role in ROLES}
        # roles per request (centralized): a prefill or a decode leg may go to any instance of
        # either side, each a vLLM with the store's connector
        self.dynamic = dynamic

    def add(self, url: str, role: str) -> Instance | None:
        """Add an instance; None when it is already there."""
        if role not in ROLES:
            raise ValueError(f"unknown role {role!r}")
        if any(i.url == url for i in self.by_role[role]):
            return None
        inst = Instance(url, role)
        self.by_role[role].append(inst)
        return inst

    def remove(self, url: str, role: str | None = None) -> list[Instance]:
        """Take an instance out of routing (requests in flight on it finish); returns those removed."""
        gone: list[Instance] = []
        for r in [role] if role else ROLES:
            keep: list[Instance] = []
            for inst in self.by_role.get(r, []):
                (gone if inst.url == url else keep).append(inst)
            self.by_role[r] = keep
        for inst in gone:
            inst.removed = True
        return gone

    def all(self) -> list[Instance]:
        """Every instance, prefill first."""
        return [i for role in ROLES for i in self.by_role[role]]

    def healthy(self, role: str) -> int:
        """How many instances of `role` are in routing now."""
        return sum(1 for i in self.by_role[role] if i.routable)

    def find(self, url: str, role: str | None = None) -> list[Instance]:
        """The instances at `url` (of `role`)."""
        return [i for r in ([role] if role else ROLES) for i in self.by_role.get(r, []) if i.url == url]

    def candidates(self, role: str, exclude: Iterable[Instance] = ()) -> list[Instance]:
        """The instances of `role` a request may go to now (healthy, not draining, not stalled),
        but `exclude`."""
        skip = set(exclude) if exclude else ()
        sides = ("prefill", "decode") if self.dynamic and role in ("prefill", "decode") else (role,)
        return [i for side in sides for i in self.by_role[side] if i.routable and i not in skip]


def load_of(inst: Instance, by: LoadKind) -> tuple[int, int]:
    """An instance's load as a leg measures it: prompt tokens in flight then requests, or the
    other way round."""
    return (inst.tokens, inst.requests) if by == "tokens" else (inst.requests, inst.tokens)
