"""How the KV of a prompt goes from the prefill leg to the decode leg (pd mode): one strategy per
way, each owning the prefill leg's payload, the decode leg's `kv_transfer_params` and the retry
rule.

- `store` (centralized): the prefiller saves the prompt's blocks to the shared store and the
  decode instance loads them; a decode leg that failed before its first token is sent again,
  to another decode instance, without a new prefill (the KV is still in the store).
- `mooncake` (vLLM's MooncakeConnector): the proxy names a `transfer_id`, and the decode leg
  pulls that transfer from the engine the prefiller's bootstrap server lists.
- `ascend` (vllm-ascend's MooncakeConnectorV1): the prefiller returns the decode leg's params.

A P2P transfer is handed over once: a decode leg that reached an instance is not sent again as
it is, and a retry runs the prefill again.
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any, ClassVar

import aiohttp

from ucmctl.proxy import rewrite
from ucmctl.proxy.jsontext import Texts
from ucmctl.proxy.metrics import Metrics
from ucmctl.proxy.pool import Instance
from ucmctl.proxy.upstream import UPSTREAM_ERRORS, LegFailed, why

Params = dict[str, Any] | None


class Handoff:
    name: ClassVar[str]
    once: ClassVar[bool] = False  # the decode leg goes to one instance only (its transfer is consumed)
    prefill_again: ClassVar[bool] = False  # a retried decode leg needs a new prefill leg

    def prefill_leg(self, body: dict[str, Any], texts: Texts | None = None) -> tuple[bytes, str | None]:
        """The prefill leg's payload and the transfer it names (None where none is named)."""
        return rewrite.prefill_payload(body, texts, p2p=None), None

    async def decode_params(
        self, session: aiohttp.ClientSession, inst: Instance, answer: bytes, transfer: str | None
    ) -> Params:
        """The decode leg's `kv_transfer_params` after prefiller `inst` answered `answer`."""
        return rewrite.kv_params_of(answer)


class Store(Handoff):
    name = "store"


class Ascend(Handoff):
    name = "ascend"
    once = prefill_again = True

    def prefill_leg(self, body: dict[str, Any], texts: Texts | None = None) -> tuple[bytes, str | None]:
        return rewrite.prefill_payload(body, texts, p2p="ascend"), None


ENGINE_TTL_S = 1.0  # a restarted prefiller registers a new engine id; it is healthy much later


class Mooncake(Handoff):
    name = "mooncake"
    once = prefill_again = True

    def __init__(self, bootstrap_of: dict[str, str], metrics: Metrics, connect_timeout: float) -> None:
        self.bootstrap_of = bootstrap_of  # prefiller URL -> its bootstrap server URL
        self.engines: dict[str, tuple[float, str]] = {}  # prefiller URL -> (when seen, engine id)
        self._metrics = metrics
        self._connect_timeout = connect_timeout

    def prefill_leg(self, body: dict[str, Any], texts: Texts | None = None) -> tuple[bytes, str | None]:
        transfer = f"xfer-{uuid.uuid4().hex}"
        return rewrite.prefill_payload(body, texts, p2p="mooncake", transfer_id=transfer), transfer

    async def decode_params(
        self, session: aiohttp.ClientSession, inst: Instance, answer: bytes, transfer: str | None
    ) -> Params:
        # vLLM's MooncakeConnector returns no params: decode pulls this transfer from the engine
        # the prefiller's bootstrap server names.
        assert transfer is not None
        bootstrap = self.bootstrap_of[inst.url]
        engine = await self._engine(session, inst.url, bootstrap)
        return rewrite.mooncake_decode_params(transfer, engine, bootstrap)

    async def _engine(self, session: aiohttp.ClientSession, url: str, bootstrap: str) -> str:
        """The engine id behind prefiller `url`, from its bootstrap server (cached for a second)."""
        loop = asyncio.get_running_loop()
        cached = self.engines.get(url)
        if cached is not None and loop.time() - cached[0] < ENGINE_TTL_S:
            return cached[1]
        try:
            timeout = aiohttp.ClientTimeout(total=self._connect_timeout)
            async with session.get(bootstrap + "/query", timeout=timeout) as resp:
                answer = await resp.read()
                if resp.status != 200:
                    raise ValueError(f"HTTP {resp.status}")
            engine = rewrite.engine_of(answer)
        except (*UPSTREAM_ERRORS, ValueError) as exc:
            self._metrics.errors["bootstrap"] += 1
            raise LegFailed(
                502,
                f"prefill instance {url}: Mooncake bootstrap {bootstrap} gave no engine: {why(exc)}",
                "upstream",
            ) from None
        self.engines[url] = (loop.time(), engine)
        return engine


HANDOFFS: dict[str, type[Handoff]] = {h.name: h for h in (Store, Mooncake, Ascend)}


def make_handoff(
    p2p: str | None, bootstrap_of: dict[str, str], metrics: Metrics, connect_timeout: float
) -> Handoff:
    """The handoff of a pd proxy: the store's without `p2p`, else that P2P protocol's."""
    if p2p == Mooncake.name:
        return Mooncake(bootstrap_of, metrics, connect_timeout)
    return HANDOFFS[p2p or Store.name]()
