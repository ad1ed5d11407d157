"""The load generator's reading of a stream that ends badly, against a real HTTP server on loopback."""

from __future__ import annotations

import asyncio
import json

from aiohttp import web

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
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        out = client.RequestResult(0, 3)
        async with client.session(1, 30) as http:
            body = client.make_body([1, 2, 3], 4, None, True, None)
            await client.send(http, f"http://127.0.0.1:{port}/v1/completions", body, out)
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
