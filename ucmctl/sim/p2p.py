"""The simulator's side of the P2P KV-transfer protocols, as the real connectors speak them.

vLLM's `MooncakeConnector` (`mooncake`): each prefill server runs a bootstrap HTTP server on
`VLLM_MOONCAKE_BOOTSTRAP_PORT` that lists its engine at `GET /query`. The router sends
`{do_remote_decode, transfer_id}` on the prefill leg (no `transfer_id`: the prefiller warns
and nothing is sent) and `{do_remote_prefill, transfer_id, remote_engine_id,
remote_bootstrap_addr}` on the decode leg (a key missing: decode warns and recomputes). The
prefiller returns no params. The simulator's decode really asks the named bootstrap server,
and counts the prompt as transferred only when that prefiller's engine matches and it
finished a prefill of that `transfer_id` (`GET /sim/transfers/ID`, the simulator's stand-in
for the data plane).

vllm-ascend's `MooncakeConnectorV1` (`ascend`): the prefiller returns the decode leg's params.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections import OrderedDict
from typing import Any

import aiohttp
from aiohttp import web

log = logging.getLogger("ucmctl.sim")

# kv_connector name -> the protocol the simulator speaks for it
PROTOCOLS = {"MooncakeConnector": "mooncake", "MooncakeConnectorV1": "ascend"}
DEFAULT_BOOTSTRAP_PORT = 8998
MAX_TRANSFERS = 100_000  # finished transfer ids a prefiller remembers
PULL_TIMEOUT_S = 10.0
DECODE_KEYS = ("remote_engine_id", "remote_bootstrap_addr", "transfer_id")


def bootstrap_port(env: dict[str, str] | None = None) -> int:
    value = (env if env is not None else os.environ).get("VLLM_MOONCAKE_BOOTSTRAP_PORT")
    return int(value) if value else DEFAULT_BOOTSTRAP_PORT


class Bootstrap:
    """A prefill simulator's bootstrap server: its engine, and the transfers it can serve."""

    def __init__(self, engine_id: str, host: str, port: int, worker_port: int) -> None:
        self.engine_id, self.host, self.port, self.worker_port = engine_id, host, port, worker_port
        self.finished: OrderedDict[str, None] = OrderedDict()
        self._runner: web.AppRunner | None = None

    def record(self, transfer_id: str) -> None:
        self.finished[transfer_id] = None
        while len(self.finished) > MAX_TRANSFERS:
            self.finished.popitem(last=False)

    async def start(self) -> None:
        app = web.Application()
        app.router.add_get("/query", self._query)
        app.router.add_get("/sim/transfers/{transfer_id}", self._transfer)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, self.host, self.port).start()
        log.info("Mooncake bootstrap server on %s:%d, engine %s", self.host, self.port, self.engine_id)

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def _query(self, _: web.Request) -> web.Response:
        worker = f"tcp://{self.host}:{self.worker_port}"
        return web.json_response({"0": {"engine_id": self.engine_id, "worker_addr": {"0": {"0": worker}}}})

    async def _transfer(self, request: web.Request) -> web.Response:
        return web.Response(status=200 if request.match_info["transfer_id"] in self.finished else 404)


def prefill_transfer_id(params: Any) -> str | None:
    """The transfer a mooncake prefill leg asks for; warns as vLLM does when the router sent none."""
    if not isinstance(params, dict) or not params.get("do_remote_decode"):
        return None
    transfer_id = params.get("transfer_id")
    if not transfer_id:
        log.warning("Missing transfer_id in kv_transfer_params from router!")
        return None
    return str(transfer_id)


NOT_ASKED, PULLED, INVALID, FAILED = "not asked", "pulled", "invalid", "failed"


async def pull(session: aiohttp.ClientSession, params: Any) -> str:
    """What became of a mooncake decode leg's pull: NOT_ASKED, PULLED, INVALID (params missing:
    vLLM warns and recomputes) or FAILED (a load failure: vLLM fails the request by default)."""
    if not isinstance(params, dict) or not params.get("do_remote_prefill"):
        return NOT_ASKED
    if not all(params.get(k) for k in DECODE_KEYS):
        log.warning("Got invalid KVTransferParams: %s. This request will not utilize KVTransfer", params)
        return INVALID
    base = str(params["remote_bootstrap_addr"]).rstrip("/")
    timeout = aiohttp.ClientTimeout(total=PULL_TIMEOUT_S)
    try:
        async with session.get(base + "/query", timeout=timeout) as resp:
            engines = await resp.json(content_type=None) if resp.status == 200 else {}
        if not any(
            isinstance(e, dict) and e.get("engine_id") == params["remote_engine_id"] for e in engines.values()
        ):
            log.error("pulling kv_caches failed: engine %s is not at %s", params["remote_engine_id"], base)
            return FAILED
        async with session.get(f"{base}/sim/transfers/{params['transfer_id']}", timeout=timeout) as resp:
            if resp.status != 200:
                log.error("pulling kv_caches failed: %s has no transfer %s", base, params["transfer_id"])
                return FAILED
    except (aiohttp.ClientError, asyncio.TimeoutError, ValueError, AttributeError) as exc:
        log.error("Failed to connect to bootstrap server %s (%s): %s", base, type(exc).__name__, exc)
        return FAILED
    return PULLED
