"""The stall watch's rule (proxy/stall): an instance streaming answers none of which brought a
byte for the timeout is cut off, every answer it streams cut there for its relay to move, every
request waiting for its first bytes there sent elsewhere; nothing else is."""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field

import aiohttp

from ucmctl.proxy.leg import Sending
from ucmctl.proxy.pool import Pool
from ucmctl.proxy.stall import cut_off, stalled


@dataclass(eq=False)
class FakeLeg:
    cuts: list[str] = field(default_factory=list)

    def cut(self, why: str) -> None:
        self.cuts.append(why)


@dataclass(eq=False)
class FakeResponse:
    closed: bool = False

    def close(self) -> None:
        self.closed = True


def test_only_an_instance_whose_every_stream_is_silent_past_the_timeout_has_stalled() -> None:
    pool = Pool()
    inst = pool.add("http://h:1", "decode")
    assert inst is not None
    inst.output_at = 100.0
    assert not stalled(inst, 200.0, 30.0)  # streams nothing: a silence is no evidence
    inst.streams.add(FakeLeg())
    assert not stalled(inst, 130.0, 30.0)  # silent exactly the timeout: not past it
    assert stalled(inst, 130.5, 30.0)
    inst.output_at = 129.0  # a byte of any of its streams
    assert not stalled(inst, 130.5, 30.0)
    inst.stalled = True
    assert not stalled(inst, 1000.0, 30.0)  # cut off once


def test_a_stalled_instance_leaves_routing_and_its_answers_and_waiting_requests_are_cut() -> None:
    pool = Pool()
    a, b = pool.add("http://h:1", "decode"), pool.add("http://h:2", "decode")
    assert a is not None and b is not None
    legs, waiting, other = [FakeLeg(), FakeLeg()], [FakeResponse()], FakeLeg()
    a.streams.update(legs)
    a.first_waits.update(waiting)
    b.streams.add(other)
    assert cut_off(a, 30.0) == 3
    assert [leg.cuts for leg in legs] == [["stall"], ["stall"]] and waiting[0].closed
    assert other.cuts == []  # another instance's answers go on where they are
    assert a.stalled and a.stalls_total == 1 and not a.routable and a.healthy
    assert pool.candidates("decode") == [b] and pool.healthy("decode") == 1


def test_a_request_waiting_for_its_headers_fails_over_when_its_instance_stalls() -> None:
    """The stall ends a wait for an answer's headers as a failed exchange (the leg then goes to
    another instance); the client going away is still a cancel, and the wait leaves no trace."""
    pool = Pool()
    inst = pool.add("http://h:1", "decode")
    assert inst is not None

    async def waits() -> str:
        never: asyncio.Future[aiohttp.ClientResponse] = asyncio.get_running_loop().create_future()
        try:
            await Sending().to(inst, never)
        except aiohttp.ServerTimeoutError as exc:
            return str(exc)
        return "answered"

    async def stall_then_client_gone() -> tuple[str, bool]:
        task = asyncio.create_task(waits())
        await asyncio.sleep(0)
        assert len(inst.first_waits) == 1
        assert cut_off(inst, 30.0) == 1
        said = await task
        assert not inst.first_waits
        gone = asyncio.create_task(waits())
        await asyncio.sleep(0)
        gone.cancel()  # the client went away: not a failure of the instance
        with contextlib.suppress(asyncio.CancelledError):
            await gone
        return said, gone.cancelled() and not inst.first_waits

    said, cancelled = asyncio.run(stall_then_client_gone())
    assert said == "http://h:1 stalled before it answered" and cancelled
