"""The KV handoff strategies: each owns its prefill leg, its decode params and its retry rule."""

from __future__ import annotations

import asyncio
import json

import aiohttp
from aiohttp import web

from ucmctl.proxy.handoff import Ascend, Mooncake, Store, make_handoff
from ucmctl.proxy.metrics import Metrics
from ucmctl.proxy.pool import Instance

BODY = {"model": "m", "prompt": [1, 2, 3], "max_tokens": 50, "stream": True, "min_tokens": 5}
P = "http://127.0.0.1:7801"


def test_the_strategy_of_each_mode() -> None:
    metrics = Metrics()
    assert type(make_handoff(None, {}, metrics, 5.0)) is Store
    assert type(make_handoff("ascend", {}, metrics, 5.0)) is Ascend
    assert type(make_handoff("mooncake", {P: "http://b:1"}, metrics, 5.0)) is Mooncake
    # the store keeps the KV: a failed decode leg is sent again without a new prefill
    assert (Store.once, Store.prefill_again) == (False, False)
    # a P2P transfer is handed over once: a retry prefills again
    assert (Ascend.once, Ascend.prefill_again) == (Mooncake.once, Mooncake.prefill_again) == (True, True)


def test_the_store_and_ascend_prefill_legs() -> None:
    payload, transfer = Store().prefill_leg(BODY)
    leg = json.loads(payload)
    assert transfer is None and leg["max_tokens"] == 1 and "stream" not in leg and "min_tokens" not in leg
    assert "kv_transfer_params" not in leg
    payload, transfer = Ascend().prefill_leg(BODY)
    leg = json.loads(payload)
    assert transfer is None and leg["min_tokens"] == 1
    assert leg["kv_transfer_params"]["do_remote_decode"] is True


def test_the_prefillers_params_ride_to_decode() -> None:
    answer = json.dumps({"choices": [], "kv_transfer_params": {"remote_block_ids": [4, 5]}}).encode()

    async def run() -> tuple[object, object]:
        async with aiohttp.ClientSession() as session:
            inst = Instance(P, "prefill")
            return (
                await Store().decode_params(session, inst, answer, None),
                await Store().decode_params(session, inst, b'{"choices": []}', None),
            )

    assert asyncio.run(run()) == ({"remote_block_ids": [4, 5]}, None)


def test_mooncake_names_a_transfer_and_pulls_it_from_the_prefillers_engine() -> None:
    asked: list[str] = []

    async def query(request: web.Request) -> web.Response:
        asked.append(request.path)
        return web.json_response({"0": {"engine_id": "engine-7"}})

    async def run() -> tuple[dict, dict, dict]:
        app = web.Application()
        app.router.add_get("/query", query)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = runner.addresses[0][1]
        bootstrap = f"http://127.0.0.1:{port}"
        try:
            handoff = Mooncake({P: bootstrap}, Metrics(), 5.0)
            payload, transfer = handoff.prefill_leg(BODY)
            async with aiohttp.ClientSession() as session:
                params = await handoff.decode_params(session, Instance(P, "prefill"), b"{}", transfer)
                again = await handoff.decode_params(session, Instance(P, "prefill"), b"{}", transfer)
            return json.loads(payload), params, {"again": again, "bootstrap": bootstrap}
        finally:
            await runner.cleanup()

    leg, params, more = asyncio.run(run())
    transfer = leg["kv_transfer_params"]["transfer_id"]
    assert transfer.startswith("xfer-") and leg["kv_transfer_params"]["do_remote_decode"] is True
    assert params == {
        "do_remote_prefill": True,
        "do_remote_decode": False,
        "transfer_id": transfer,
        "remote_engine_id": "engine-7",
        "remote_bootstrap_addr": more["bootstrap"],
    }
    assert more["again"] == params and asked == ["/query"]  # the engine id is cached for a second
