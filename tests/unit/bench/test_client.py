"""The load generator's reading of a stream that ends badly, against a real HTTP server on loopback."""

from __future__ import annotations

import asyncio
import json

from aiohttp import web

from tests.support.http import serve
from ucmctl.bench import client

TOKEN = b'data: {"choices":[{"index":0,"text":"a"}]}\n\n'
ERROR = {"error": {"message": "decode instance http://x:1 failed mid-stream", "code": 502}}


async def _serve(tail: bytes, cut: bool) -> client.RequestResult:
    async def handler(request: web.Request) -> web.StreamResponse:
        out = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await out.prepare(request)
        await out.write(TOKEN + tail)
        if cut:
            assert request.transport is not None
            request.transport.close()  # no end of the chunked body
        else:
            await out.write_eof()
        return out

    app = web.Application()
    app.router.add_post("/v1/completions", handler)
    url, runner = await serve(app)
    try:
        out = client.RequestResult(0, 3)
        async with client.session(1, 30) as http:
            body = client.make_body([1, 2, 3], 4, None, True, None)
            await client.send(http, f"{url}/v1/completions", body, out)
        return out
    finally:
        await runner.cleanup()


def test_an_error_event_before_the_cut_is_the_reason_given() -> None:
    out = asyncio.run(_serve(b"data: " + json.dumps(ERROR).encode() + b"\n\n", cut=True))
    assert not out.ok and out.ttft > 0
    assert out.error == "error event: decode instance http://x:1 failed mid-stream"


def test_a_cut_without_an_error_event_names_the_broken_payload() -> None:
    out = asyncio.run(_serve(b"", cut=True))
    assert not out.ok and out.error.startswith("ClientPayloadError")


def test_an_error_event_in_a_stream_that_ends_cleanly_fails_the_request() -> None:
    out = asyncio.run(_serve(b"data: " + json.dumps(ERROR).encode() + b"\n\ndata: [DONE]\n\n", cut=False))
    assert not out.ok and out.error.startswith("error event: decode instance")


def _closed_port() -> int:
    """A loopback port nothing listens on (bound, then closed: connections to it are refused)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def _doors(n: int, refused: set[int]) -> tuple[list[client.RequestResult], list[int]]:
    """`n` streamed requests over two doors, the ones in `refused` not listening: the results
    and how many requests each listening door served."""
    served = [0, 0]

    def handler_of(k: int):  # type: ignore[no-untyped-def]
        async def handler(request: web.Request) -> web.StreamResponse:
            served[k] += 1
            out = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await out.prepare(request)
            usage = {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 1}}
            await out.write(TOKEN + b"data: " + json.dumps(usage).encode() + b"\n\ndata: [DONE]\n\n")
            await out.write_eof()
            return out

        return handler

    runners, urls = [], []
    for k in range(2):
        if k in refused:
            urls.append(f"http://127.0.0.1:{_closed_port()}/v1/completions")
            continue
        app = web.Application()
        app.router.add_post("/v1/completions", handler_of(k))
        url, runner = await serve(app)
        runners.append(runner)
        urls.append(f"{url}/v1/completions")
    try:
        async with client.session(4, 30) as http:
            bodies = [client.make_body([1, 2, 3], 1, None, True, None)] * n
            run = await client.run_phase(http, urls, bodies, [3] * n, 4)
        return run.results, served
    finally:
        for runner in runners:
            await runner.cleanup()


def test_requests_go_to_each_door_in_turn() -> None:
    results, served = asyncio.run(_doors(6, set()))
    assert all(r.ok for r in results) and served == [3, 3]
    assert [r.door for r in results] == [0, 1, 0, 1, 0, 1] and not any(r.refused for r in results)


def test_a_door_that_refuses_the_connection_sends_the_request_on_to_the_next() -> None:
    results, served = asyncio.run(_doors(6, {1}))
    assert all(r.ok for r in results), [r.error for r in results]
    assert served == [6, 0] and all(r.door == 0 for r in results)
    assert [r.refused for r in results] == [0, 1, 0, 1, 0, 1]  # those meant for the dead one
    assert [r.sent_on for r in results] == [False, True] * 3


def test_every_door_refusing_is_a_failed_request_that_says_so() -> None:
    results, _ = asyncio.run(_doors(2, {0, 1}))
    assert not any(r.ok for r in results) and all(r.refused == 2 for r in results)
    assert not any(r.sent_on for r in results)  # no door took them: not sent on, failed
    assert all(r.error.startswith("ClientConnectorError") for r in results), [r.error for r in results]
