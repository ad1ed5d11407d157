"""The simulator's HTTP server: vLLM's OpenAI-compatible routes over simulated engines (the
answers' shapes: `replies`)."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import os
import time
import uuid
from dataclasses import dataclass
from typing import Any

import aiohttp
from aiohttp import web

from ucmctl.sim import p2p as p2p_protocol
from ucmctl.sim import replies
from ucmctl.sim.engine import Engine, SimRequest
from ucmctl.sim.external import ExternalTier
from ucmctl.sim.kv_events import EventsConfig, Publisher
from ucmctl.sim.metrics import exposition
from ucmctl.sim.prefix_cache import PrefixCache, block_keys
from ucmctl.sim.profile import SLOWDOWN_VARIABLE, Profile, prefill_slowdown
from ucmctl.sim.replies import Decoder, Reply
from ucmctl.sim.tokens import Tokenizer

log = logging.getLogger("ucmctl.sim")


@dataclass(frozen=True)
class SimConfig:
    model: str
    served_name: str
    host: str
    port: int
    block_size: int
    max_num_seqs: int
    max_num_batched_tokens: int
    max_model_len: int
    data_parallel_size: int  # internal DP: engines inside this one server
    prefix_caching: bool
    kv_cache_blocks: int
    ucm_config_file: str | None
    kv_role: str | None
    profile: Profile
    load_seconds: float = 0.0  # before the port opens, as a real server loads its weights
    p2p: str | None = None  # the P2P protocol of its Mooncake connector (sim/p2p.py), if any
    bootstrap_port: int = p2p_protocol.DEFAULT_BOOTSTRAP_PORT  # mooncake, prefill side
    kv_load_failure_policy: str = "fail"  # vLLM's default: a failed KV load fails the request
    kv_events: EventsConfig | None = None  # --kv-events-config: publish the prefix cache's events
    data_parallel_rank: int = 0  # external DP: this server's rank (its engine's)


class BadRequest(Exception):
    def __init__(self, message: str, param: str | None = None, *, status: int = 400) -> None:
        super().__init__(message)
        self.param = param
        self.status = status


class SimServer:
    def __init__(self, config: SimConfig, tokenizer: Tokenizer) -> None:
        self.config = config
        self.tokenizer = tokenizer
        self.namespace = f"sim|{config.served_name}|{config.block_size}".encode()
        self.engine_id = str(uuid.uuid4())
        block_bytes = config.profile.kv_bytes_per_token * config.block_size
        self.external = ExternalTier(config.ucm_config_file, block_bytes) if config.ucm_config_file else None
        self.engines = [
            Engine(
                i,
                config.profile,
                block_size=config.block_size,
                max_num_seqs=config.max_num_seqs,
                max_num_batched_tokens=config.max_num_batched_tokens,
                cache=PrefixCache(
                    config.kv_cache_blocks, enabled=config.prefix_caching, block_size=config.block_size
                ),
                external=self.external,
                vocab=tokenizer.vocab_size,
            )
            for i in range(config.data_parallel_size)
        ]
        self._next = 0
        self.decoder = Decoder(tokenizer)
        self.bootstrap: p2p_protocol.Bootstrap | None = None
        if config.p2p == "mooncake" and config.kv_role in ("kv_producer", "kv_both"):
            self.bootstrap = p2p_protocol.Bootstrap(
                self.engine_id, config.host, config.bootstrap_port, config.port
            )
        self._session: aiohttp.ClientSession | None = None
        self.publishers: list[Publisher] = []  # one per engine, with --kv-events-config

    def app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_get("/health", self.health)
        app.router.add_get("/v1/models", self.models)
        app.router.add_get("/metrics", self.metrics)
        app.router.add_post("/v1/completions", self.completions)
        app.router.add_post("/v1/chat/completions", self.chat)
        app.router.add_post("/reset_prefix_cache", self.reset_prefix_cache)
        app.router.add_post("/tokenize", self.tokenize)
        app.on_startup.append(self._start)
        app.on_cleanup.append(self._stop)
        return app

    async def _start(self, _: web.Application) -> None:
        for e in self.engines:
            if self.config.kv_events is not None:
                # vLLM's rule: each engine publishes on the endpoint's port plus its DP rank
                rank = self.config.data_parallel_rank + e.index
                self.publishers.append(Publisher(self.config.kv_events, rank))
                e.cache.events = []
                e.publish = self.publishers[-1].send
            e.start()
        if self.bootstrap is not None:
            await self.bootstrap.start()

    async def _stop(self, _: web.Application) -> None:
        for e in self.engines:
            await e.stop()
        for publisher in self.publishers:
            publisher.close()
        if self.bootstrap is not None:
            await self.bootstrap.stop()
        if self._session is not None:
            await self._session.close()
        if self.external is not None:
            self.external.close()

    # -- routes ---------------------------------------------------------------------------

    async def health(self, _: web.Request) -> web.Response:
        return web.Response(status=200)

    async def models(self, _: web.Request) -> web.Response:
        card = {
            "id": self.config.served_name,
            "object": "model",
            "created": int(time.time()),
            "owned_by": "ucmctl-sim",
            "root": self.config.model,
            "max_model_len": self.config.max_model_len,
        }
        return web.json_response({"object": "list", "data": [card]})

    async def metrics(self, _: web.Request) -> web.Response:
        text = exposition(self.config.served_name, self.engines)
        return web.Response(text=text, content_type="text/plain", charset="utf-8")

    async def reset_prefix_cache(self, request: web.Request) -> web.Response:
        for e in self.engines:
            e.cache.reset()
            e.flush_events()
        return web.Response(status=200)

    async def tokenize(self, request: web.Request) -> web.Response:
        """vLLM's /tokenize: a text prompt's or a chat's token ids, as a request of it is
        tokenized (so its blocks are the ones its KV-cache events name)."""
        try:
            body = await _json_body(request)
            self._check_model(body)
            chat = "messages" in body
            if not chat and not isinstance(body.get("prompt"), str):
                raise BadRequest("'prompt' must be a string (or send 'messages')", "prompt")
            ids = self._prompt(body, chat)
        except BadRequest as exc:
            return replies.error_reply(str(exc), exc.param, exc.status)
        answer = {"count": len(ids), "max_model_len": self.config.max_model_len, "tokens": ids}
        return web.json_response({**answer, "token_strs": None})

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(request, chat=False)

    async def chat(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(request, chat=True)

    # -- request handling -----------------------------------------------------------------

    async def _serve(self, request: web.Request, chat: bool) -> web.StreamResponse:
        try:
            body = await _json_body(request)
            self._check_model(body)
            if body.get("stream_options") and not body.get("stream"):  # vLLM 0.32's check
                raise BadRequest("Stream options can only be defined when `stream=True`.", "stream_options")
            prompt = self._prompt(body, chat)
            namespace = self._salted(body)
            max_tokens = self._max_tokens(body, len(prompt))
            self._check_fits(len(prompt) + max_tokens)
            n = _choices(body)
        except BadRequest as exc:
            return replies.error_reply(str(exc), exc.param, exc.status)
        request_id = request.headers.get("X-Request-Id") or uuid.uuid4().hex
        kv_params = body.get("kv_transfer_params")
        transfer_id = None
        if self.config.p2p == "mooncake":
            transfer_id = p2p_protocol.prefill_transfer_id(kv_params) if self.bootstrap else None
            if self._session is None:
                self._session = aiohttp.ClientSession()
            pulled = await p2p_protocol.pull(self._session, kv_params)
            if pulled == p2p_protocol.FAILED and self.config.kv_load_failure_policy == "fail":
                log.error("Failing 1 request(s) due to KV load failure (failure_policy=fail)")
                return replies.internal_error_reply()
            remote_kv = pulled == p2p_protocol.PULLED
        else:
            remote_kv = bool(isinstance(kv_params, dict) and kv_params.get("do_remote_prefill"))
        sim_request = SimRequest(
            request_id=request_id,
            prompt=prompt,
            max_tokens=max_tokens,
            keys=block_keys(prompt, self.config.block_size, namespace),
            remote_kv=remote_kv,
            namespace=namespace,
        )
        # n > 1: vLLM's parallel sampling, one more sequence of the same prompt per choice
        others = [
            dataclasses.replace(
                sim_request,
                request_id=f"{request_id}-{i}",
                keys=list(sim_request.keys),
                out=asyncio.Queue(),
                output=[],
            )
            for i in range(1, n)
        ]
        engine = self._pick_engine()
        for r in (sim_request, *others):
            engine.submit(r)
        prefix = "chatcmpl" if chat else "cmpl"
        ctx = Reply(
            id=f"{prefix}-{request_id}",
            model=self.config.served_name,
            chat=chat,
            created=int(time.time()),
            kv_transfer_params=self._kv_params_out(kv_params, sim_request),
        )
        ctx.return_token_ids = bool(body.get("return_token_ids"))
        include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
        try:
            if others:
                return await replies.many(
                    request,
                    [sim_request, *others],
                    ctx,
                    self.decoder,
                    bool(body.get("stream")),
                    include_usage,
                )
            if body.get("stream"):
                return await replies.stream(request, sim_request, ctx, self.decoder, include_usage)
            return await replies.whole(sim_request, ctx, self.decoder)
        finally:
            if transfer_id is not None and sim_request.delivered and self.bootstrap is not None:
                self.bootstrap.record(transfer_id)  # the prefilled KV is ready to be pulled
            for r in (sim_request, *others):
                if not r.delivered:
                    engine.cancel(r)  # the client went away: free the engine

    def _pick_engine(self) -> Engine:
        least = min(e.load for e in self.engines)
        candidates = [e for e in self.engines if e.load == least]
        self._next += 1
        return candidates[self._next % len(candidates)]

    def _check_model(self, body: dict[str, Any]) -> None:
        """vLLM serves only the names it was started with (unless VLLM_SKIP_MODEL_NAME_VALIDATION
        is set): another one is a 404, with vLLM's message."""
        model = body.get("model")
        if not model or model == self.config.served_name or os.environ.get("VLLM_SKIP_MODEL_NAME_VALIDATION"):
            return
        raise BadRequest(
            f"The model `{model}` does not exist. Valid aliases: {self.config.served_name}.",
            "model",
            status=404,
        )

    def _salted(self, body: dict[str, Any]) -> bytes:
        """The request's key namespace: vLLM's `cache_salt` enters its first block's hash, so
        every block key of a salted prompt differs from the unsalted one's (and the store's keys
        with them); checked as vLLM 0.32 checks it."""
        salt = body.get("cache_salt")
        if salt is None:
            return self.namespace
        if not isinstance(salt, str) or not salt:
            raise BadRequest("Parameter 'cache_salt' must be a non-empty string if provided.", "cache_salt")
        if len(salt) > 128 or any(c in "@/\\\0" for c in salt):
            raise BadRequest(
                "Parameter 'cache_salt' must be at most 128 characters and must not contain "
                "'@', '/', '\\\\', or NUL.",
                "cache_salt",
            )
        return self.namespace + b"|salt|" + salt.encode()

    def _prompt(self, body: dict[str, Any], chat: bool) -> list[int]:
        if chat:
            messages = body.get("messages")
            if not isinstance(messages, list) or not messages:
                raise BadRequest("'messages' must be a non-empty list", "messages")
            text = "\n".join(
                f"{m.get('role', 'user')}: {_content(m)}" for m in messages if isinstance(m, dict)
            )
            return self.tokenizer.encode(text) or [0]
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
            prompt = prompt[0]
        if isinstance(prompt, str):
            ids = self.tokenizer.encode(prompt)
        elif isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
            ids = list(prompt)
            if any(t < 0 or t >= self.tokenizer.vocab_size for t in ids):
                raise BadRequest(f"token id out of vocabulary (0..{self.tokenizer.vocab_size - 1})", "prompt")
        else:
            raise BadRequest("'prompt' must be a string or a non-empty list of token ids", "prompt")
        if not ids:
            raise BadRequest("the prompt is empty", "prompt")
        return ids

    def _max_tokens(self, body: dict[str, Any], prompt_len: int) -> int:
        value = body.get("max_completion_tokens", body.get("max_tokens"))
        limit = self.config.max_model_len
        if value is None:
            value = max(1, limit - prompt_len)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise BadRequest("max_tokens must be an integer of at least 1", "max_tokens")
        if prompt_len + value > limit:
            raise BadRequest(
                f"This model's maximum context length is {limit} tokens. However, you requested "
                f"{prompt_len + value} tokens ({prompt_len} in the messages, {value} in the completion). "
                "Please reduce the length of the messages or completion.",
                "max_tokens",
            )
        return value

    def _check_fits(self, tokens: int) -> None:
        """vLLM refuses to start when max_model_len does not fit in one engine's KV cache, so
        a request that alone would outgrow it never reaches an engine; the simulator, which
        starts anyway, refuses the request instead of letting it overcommit."""
        capacity = self.engines[0].num_blocks * self.config.block_size
        if tokens > capacity:
            raise BadRequest(
                f"This request needs KV cache for {tokens} tokens, more than an engine holds "
                f"({capacity} tokens): vLLM would not start with max_model_len above that. "
                "Reduce the prompt or max_tokens, or raise --kv-cache-gib.",
                "max_tokens",
            )

    def _kv_params_out(self, kv_in: Any, r: SimRequest) -> dict[str, Any] | None:
        if not isinstance(kv_in, dict) or self.config.p2p == "mooncake":
            return None  # vLLM's MooncakeConnector returns none: the router knows the engine
        if kv_in.get("do_remote_decode"):  # P2P prefill leg: tell decode where the KV is
            return {
                "do_remote_prefill": True,
                "do_remote_decode": False,
                "remote_engine_id": self.engine_id,
                "remote_host": self.config.host,
                "remote_port": self.config.port,
                "remote_block_ids": list(range(len(r.keys))),
                "request_id": r.request_id,
            }
        return dict(kv_in)


def _choices(body: dict[str, Any]) -> int:
    n = body.get("n", 1)
    if n is None:
        return 1
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise BadRequest("n must be at least 1", "n")
    temperature = body.get("temperature")
    if n > 1 and isinstance(temperature, int | float) and temperature < 1e-5:  # vLLM's rule
        raise BadRequest(f"n must be 1 when using greedy sampling, got {n}.", "n")
    return n


def _content(message: dict[str, Any]) -> str:
    content = message.get("content", "")
    if isinstance(content, list):
        return " ".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
    return str(content)


async def _json_body(request: web.Request) -> dict[str, Any]:
    try:
        body = await request.json()
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise BadRequest(f"the body is not valid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise BadRequest("the body must be a JSON object")
    return body


async def serve(server: SimServer) -> None:
    """Run until cancelled."""
    if server.config.load_seconds:
        log.info("sim: loading (waiting %.1f s before serving)", server.config.load_seconds)
        await asyncio.sleep(server.config.load_seconds)
    runner = web.AppRunner(server.app(), handler_cancellation=True, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, server.config.host, server.config.port, reuse_address=True)
    await site.start()
    log.info(
        "sim: serving %s on http://%s:%d", server.config.served_name, server.config.host, server.config.port
    )
    if prefill_slowdown() != 1.0:
        log.warning("sim: every prefill costs %gx ($%s)", prefill_slowdown(), SLOWDOWN_VARIABLE)
    try:
        await asyncio.Event().wait()
    finally:
        await runner.cleanup()
