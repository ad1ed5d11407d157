"""The upstream leg whose answer a client is getting, as its instance counts it."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
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
    # cut on purpose: "drain" (its instance is drained for a restart), "stall" (it stopped sending)
    moved: str | None = None
    watched: bool = False  # a stream: its instance's silence is watched (proxy/stall)
    client: asyncio.BaseTransport | None = None  # the connection its client reads it from

    def __post_init__(self) -> None:
        self.inst.streaming += 1

    def hold(self, answer: resume.Answer) -> None:
        """The answer can go on on another instance: its instance may move it (`move`)."""
        self.answer = answer
        self.inst.answers.add(self)

    def watch(self, now: float, client: asyncio.BaseTransport | None = None) -> None:
        """Its upstream streams (its first bytes came at `now`, the event loop's clock) to
        `client`: a silence of its instance longer than the stall timeout cuts it (proxy/stall)."""
        self.watched, self.client = True, client or self.client
        self.inst.streams.add(self)
        self.inst.output_at = now

    def move(self, limit: int) -> None:
        """Cut it here on purpose (its instance is drained) where it can go on elsewhere (it has
        moved fewer than `limit` times): the relay goes on on another instance."""
        if self.answer is not None and self.answer.migrations < limit and self.answer.resumable():
            self.cut("drain")

    def client_slow(self) -> bool:
        """Whether its client has not taken all it was sent yet: the relay may be waiting for it
        to, reading nothing from the instance meanwhile."""
        client = self.client
        return isinstance(client, asyncio.WriteTransport) and client.get_write_buffer_size() > 0

    def cut(self, why: str) -> None:
        """Cut it here on purpose (`why`: drain, stall): the relay's read fails at once and the
        answer goes on elsewhere where it can, or ends with an error that says why not; the
        instance stops the request."""
        self.moved = why
        self.resp.close()

    def end(self) -> None:
        """The answer is over: this drops the upstream connection on any early exit (the instance
        stops the request) and frees the instance's count."""
        self.resp.close()
        self.inst.streaming -= 1
        self.inst.release(self.tokens)
        self.inst.answers.discard(self)
        self.inst.streams.discard(self)

    def swap(
        self, inst: Instance, resp: aiohttp.ClientResponse, tokens: int, first: bytes, now: float
    ) -> None:
        """A continuation takes over the answer from here (its first bytes came at `now`)."""
        self.end()
        self.inst, self.resp, self.tokens, self.first = inst, resp, tokens, first
        self.moved = None
        inst.streaming += 1
        if self.answer is not None:
            inst.answers.add(self)
        if self.watched:
            self.watch(now)


class Sending:
    """A leg's request on its way to an instance, its answer's headers not come yet: a stall of
    the instance (proxy/stall) ends the wait as a failed exchange, so the leg goes elsewhere."""

    __slots__ = ("cut", "task")

    def __init__(self) -> None:
        self.task = asyncio.current_task()
        self.cut = False

    async def to(self, inst: Instance, sent: Awaitable[aiohttp.ClientResponse]) -> aiohttp.ClientResponse:
        """`sent`'s response, or aiohttp's ServerTimeoutError when `inst` stalled first."""
        inst.first_waits[self] = asyncio.get_running_loop().time()
        try:
            return await sent
        except asyncio.CancelledError:
            # the stall's cancel, and no other (the client's) pending: a failure of the exchange
            if self.cut and self.task is not None and _only_cancel(self.task):
                raise aiohttp.ServerTimeoutError(f"{inst.url} stalled before it answered") from None
            raise
        finally:
            inst.first_waits.pop(self, None)

    def close(self) -> None:
        """Stop the wait (the instance stalled)."""
        self.cut = True
        if self.task is not None:
            self.task.cancel()


def _only_cancel(task: asyncio.Task[object]) -> bool:
    """Take back one cancel of `task`: whether no other is pending (Python 3.11 on counts them;
    3.10 does not, and a client that went away at that very moment is found at the next write)."""
    uncancel = getattr(task, "uncancel", None)
    return uncancel is None or uncancel() == 0
