"""fetch_metrics against a real aiohttp server on loopback: the text when it answers 200, None
for every way a server can fail to (an error status, bytes that are not text, an answer slower
than the bound, nothing listening), and the bound holds."""

from __future__ import annotations

import asyncio
import time

import aiohttp
from aiohttp import web

from ucmctl.bench.scrape import fetch_metrics

PAGE = "# TYPE x counter\nx_total 3\n"


async def _serve() -> tuple[web.AppRunner, str]:
    async def ok(_: web.Request) -> web.Response:
        return web.Response(text=PAGE)

    async def error(_: web.Request) -> web.Response:
        return web.Response(status=500, text=PAGE)

    async def binary(_: web.Request) -> web.Response:
        return web.Response(body=b"x_total \xff\xfe\n", content_type="text/plain", charset="utf-8")

    async def slow(_: web.Request) -> web.Response:
        await asyncio.sleep(5)  # cancelled once the client gives up (handler_cancellation)
        return web.Response(text=PAGE)

    app = web.Application()
    for name, handler in (("ok", ok), ("error", error), ("binary", binary), ("slow", slow)):
        app.router.add_get(f"/{name}/metrics", handler)
    runner = web.AppRunner(app, handler_cancellation=True)  # a client gone ends its handler
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return runner, f"http://127.0.0.1:{runner.addresses[0][1]}"


def test_fetch_metrics_returns_the_page_or_none_within_its_bound() -> None:
    async def main() -> dict[str, object]:
        runner, base = await _serve()
        try:
            async with aiohttp.ClientSession() as http:
                got: dict[str, object] = {}
                for name in ("ok", "error", "binary"):
                    got[name] = await fetch_metrics(http, f"{base}/{name}", 5.0)
                got["nothing"] = await fetch_metrics(http, "http://127.0.0.1:1", 5.0)
                began = time.perf_counter()
                got["slow"] = await fetch_metrics(http, f"{base}/slow", 0.5)
                got["slow_s"] = time.perf_counter() - began
                return got
        finally:
            await runner.cleanup()

    got = asyncio.run(main())
    assert got["ok"] == PAGE
    assert got["error"] is None and got["binary"] is None and got["nothing"] is None
    assert got["slow"] is None
    assert 0.4 < float(got["slow_s"]) < 3.0  # type: ignore[arg-type]
