"""The upstream leg whose answer a client is getting, as its instance counts it."""

from __future__ import annotations

from dataclasses import dataclass

import aiohttp

from ucmctl.proxy import resume
from ucmctl.proxy.pool import Instance


@dataclass(eq=False)  # one per answer, kept in a set by its instance
class Leg:
    """The upstream whose answer the client is getting: its instance counts it as streaming
    until it ends (a migration swaps in the continuation's)."""

    inst: Instance
    resp: aiohttp.ClientResponse
    tokens: int
    first: bytes  # its first bytes, read already
    wrote_at: float = 0.0  # when its last bytes went to the client (the event loop's clock)
    clean: bool = True  # what went to the client so far ends between two events
    answer: resume.Answer | None = None  # where it can go on elsewhere: its instance lists it
    moved: bool = False  # cut on purpose: its instance is drained for a restart

    def __post_init__(self) -> None:
        self.inst.streaming += 1

    def hold(self, answer: resume.Answer) -> None:
        """The answer can go on on another instance: its instance may move it (`move`)."""
        self.answer = answer
        self.inst.answers.add(self)

    def move(self, limit: int) -> None:
        """Cut it here on purpose (its instance is drained) where it can go on elsewhere (it has
        moved fewer than `limit` times): the relay goes on on another instance."""
        if self.answer is not None and self.answer.migrations < limit and self.answer.resumable():
            self.moved = True
            self.resp.close()  # the relay's read fails at once; the instance stops the request

    def end(self) -> None:
        """The answer is over: this drops the upstream connection on any early exit (the instance
        stops the request) and frees the instance's count."""
        self.resp.close()
        self.inst.streaming -= 1
        self.inst.release(self.tokens)
        self.inst.answers.discard(self)

    def swap(self, inst: Instance, resp: aiohttp.ClientResponse, tokens: int, first: bytes) -> None:
        """A continuation takes over the answer from here."""
        self.end()
        self.inst, self.resp, self.tokens, self.first = inst, resp, tokens, first
        self.moved = False
        inst.streaming += 1
        if self.answer is not None:
            inst.answers.add(self)
