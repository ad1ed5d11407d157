"""The stall watch's rule (proxy/stall): an instance streaming answers none of which brought a
byte for the timeout is cut off, every answer it streams cut there for its relay to move, every
request waiting for its first bytes there sent elsewhere; nothing else is."""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field

import aiohttp

from tests.support.http import serve
from ucmctl.proxy.leg import Sending
from ucmctl.proxy.pool import Pool
from ucmctl.proxy.stall import cut_off, probe, stalled, suspected


@dataclass(eq=False)
class FakeLeg:
    cuts: list[str] = field(default_factory=list)
    slow: bool = False

    def client_slow(self) -> bool:
        return self.slow

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
    slow = FakeLeg(slow=True)  # its relay may wait on a client slow to read: not the instance's silence
    inst.streams.add(slow)
    assert not stalled(inst, 160.0, 30.0)
    slow.slow = False
    assert stalled(inst, 160.0, 30.0)
    inst.stalled = True
    assert not stalled(inst, 1000.0, 30.0)  # cut off once


def test_an_instance_others_wait_on_with_nothing_from_it_past_the_timeout_is_suspected() -> None:
    """Requests waiting for first bytes, nothing from the instance since the oldest began: a
    probe is due (a long prefill looks the same); a byte since, or nothing waiting, clears it."""
    pool = Pool()
    inst = pool.add("http://h:1", "prefill")
    assert inst is not None
    assert not suspected(inst, 1000.0, 30.0)  # nothing waits there
    inst.first_waits.update({FakeResponse(): 100.0, FakeResponse(): 120.0})
    assert not suspected(inst, 130.0, 30.0) and suspected(inst, 130.5, 30.0)  # the oldest: 100
    inst.output_at = 110.0  # an answer since the oldest began
    assert not suspected(inst, 140.0, 30.0) and suspected(inst, 140.5, 30.0)
    inst.stalled = True
    assert not suspected(inst, 1000.0, 30.0)  # cut off already


def test_a_stalled_instance_leaves_routing_and_its_answers_and_waiting_requests_are_cut() -> None:
    pool = Pool()
    a, b = pool.add("http://h:1", "decode"), pool.add("http://h:2", "decode")
    assert a is not None and b is not None
    legs, waiting, other = [FakeLeg(), FakeLeg()], [FakeResponse()], FakeLeg()
    a.streams.update(legs)
    a.first_waits.update(dict.fromkeys(waiting, 0.0))
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


def test_a_stalled_instance_is_probed_with_a_one_token_completion_and_the_proxys_key() -> None:
    """The probe asks the model the instance serves (its /v1/models) for one token, with the key
    the proxy sends its instances: an instance that answers it steps; one that refuses it (a
    wrong key) or answers no choice does not."""
    from aiohttp import web

    asked: list[dict[str, object]] = []

    async def models(request: web.Request) -> web.Response:
        if request.headers.get("Authorization") != "Bearer k":
            return web.json_response({"error": "key"}, status=401)
        return web.json_response({"data": [{"id": "served-model"}]})

    async def completions(request: web.Request) -> web.Response:
        if request.headers.get("Authorization") != "Bearer k":
            return web.json_response({"error": "key"}, status=401)
        body = await request.json()
        asked.append(body)
        return web.json_response({"choices": [{"text": "x"}]} if body["model"] == "served-model" else {})

    async def go() -> list[bool]:
        app = web.Application()
        app.router.add_get("/v1/models", models)
        app.router.add_post("/v1/completions", completions)
        url, runner = await serve(app)
        pool = Pool()
        inst = pool.add(url, "decode")
        assert inst is not None
        key = {"Authorization": "Bearer k"}
        try:
            async with aiohttp.ClientSession() as s:
                return [
                    await probe(s, inst, None, 5.0, key),
                    await probe(s, inst, "served-model", 5.0, key),
                    await probe(s, inst, None, 5.0, {}),
                    await probe(s, inst, "another", 5.0, key),
                ]
        finally:
            await runner.cleanup()

    assert asyncio.run(go()) == [True, True, False, False]
    assert asked[0] == {"model": "served-model", "prompt": "ping", "max_tokens": 1, "temperature": 0}
