"""The request path: prefill leg with retries, then the decode (or mixed) leg relayed as it arrives."""

from __future__ import annotations

import asyncio
import contextlib
import json
import uuid
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from aiohttp import web

from ucmctl.proxy import rewrite
from ucmctl.proxy.balancer import Instance, LoadKind, Pool
from ucmctl.proxy.config import ProxyConfig
from ucmctl.proxy.health import log, record_failure, record_success
from ucmctl.proxy.metrics import Metrics

# errors of the upstream exchange itself (not of the client's side)
UPSTREAM_ERRORS = (aiohttp.ClientError, asyncio.TimeoutError)


@dataclass
class ProxyState:
    """What every handler shares: settings, instances, metrics and the one client session."""

    config: ProxyConfig
    pool: Pool = field(default_factory=Pool)
    metrics: Metrics = field(default_factory=Metrics)
    session: aiohttp.ClientSession | None = None
    upstream_headers: dict[str, str] = field(default_factory=dict)
    # --p2p mooncake: prefiller URL -> its bootstrap server URL, and the engine id last seen there
    bootstrap_of: dict[str, str] = field(default_factory=dict)
    engines: dict[str, tuple[float, str]] = field(default_factory=dict)

    @classmethod
    def create(cls, config: ProxyConfig) -> ProxyState:
        """The state for `config`, every configured instance in routing."""
        state = cls(config)
        for role, urls in (
            ("prefill", config.prefillers),
            ("decode", config.decoders),
            ("mixed", config.instances),
        ):
            for url in urls:
                state.pool.add(url, role)
        state.bootstrap_of = dict(zip(config.prefillers, config.bootstraps, strict=False))
        # identity: relay the upstream's bytes as they are, no decompress and recompress
        state.upstream_headers = {"Content-Type": "application/json", "Accept-Encoding": "identity"}
        if config.upstream_api_key:
            state.upstream_headers["Authorization"] = f"Bearer {config.upstream_api_key}"
        return state

    def timeout(self) -> aiohttp.ClientTimeout:
        """Per-leg timeouts: bounded connect and silence, no bound on a long generation."""
        cfg = self.config
        return aiohttp.ClientTimeout(
            total=None, sock_connect=cfg.connect_timeout, sock_read=cfg.read_timeout or None
        )


class LegFailed(Exception):
    """No instance could serve a leg; becomes the client's error response."""

    def __init__(self, status: int, message: str, reason: str) -> None:
        super().__init__(message)
        self.status, self.message, self.reason = status, message, reason


def error_response(status: int, message: str, rid: str | None = None) -> web.Response:
    """An OpenAI-style JSON error."""
    kind = "invalid_request_error" if status < 500 else "upstream_error"
    body = {"error": {"message": message, "type": kind, "code": status}}
    headers = {"X-Request-Id": rid} if rid else None
    return web.json_response(body, status=status, headers=headers)


async def serve_generate(request: web.Request, state: ProxyState, path: str) -> web.StreamResponse:
    """Serve one completion or chat request: prefill (pd mode) then the relayed answer."""
    cfg, metrics = state.config, state.metrics
    t0 = asyncio.get_running_loop().time()
    metrics.requests[path] += 1
    raw = await request.read()
    rid = request.headers.get("X-Request-Id") or uuid.uuid4().hex
    try:
        body = rewrite.parse_body(raw, path)
    except rewrite.BadRequest as exc:
        metrics.errors["bad_request"] += 1
        return error_response(400, str(exc), rid)
    tokens = rewrite.prompt_tokens(body, path)
    key = rewrite.prefix_key(body, path, cfg.affinity_tokens) if cfg.prefix_affinity else None
    headers = {**state.upstream_headers, "X-Request-Id": rid}
    try:
        inst, resp, first = await _answer(state, raw, body, path, tokens, key, headers)
    except LegFailed as exc:
        metrics.errors[exc.reason] += 1
        return error_response(exc.status, exc.message, rid)
    except _Answered as answered:
        return answered.response
    inst.streaming += 1
    try:
        return await _relay(request, state, inst, resp, first, body.get("stream") is True, t0, rid)
    finally:
        resp.close()  # on any early exit this drops the upstream connection: the instance stops the request
        inst.streaming -= 1
        inst.release(tokens)


async def _answer(
    state: ProxyState,
    raw: bytes,
    body: dict[str, Any],
    path: str,
    tokens: int,
    key: bytes | None,
    headers: dict[str, str],
) -> tuple[Instance, aiohttp.ClientResponse, bytes]:
    """The upstream whose answer goes to the client, and the answer's first bytes.

    Nothing goes to the client before those bytes came: an upstream that dies before its first
    token is tried again on another instance of its role (the client has seen nothing of it).
    Store mode sends the decode leg again (the prefill's KV is in the store); p2p mode runs the
    prefill again too (the prefiller handed its KV to the instance that died).
    """
    cfg = state.config
    avoid: list[Instance] = []
    kv_params: dict[str, Any] | None = None
    prefilled = False
    prefill_ended = 0.0
    last: LegFailed | None = None
    for attempt in range(cfg.retries + 1):
        if attempt:
            await asyncio.sleep(cfg.retry_backoff * 2 ** (attempt - 1))
        if cfg.mode == "pd":
            if not prefilled or cfg.p2p:
                kv_params, prefill_ended = await _prefill(state, body, path, tokens, key, headers)
                prefilled = True
            payload, role, leg_key = rewrite.decode_payload(raw, body, kv_params), "decode", None
        else:
            payload, role, leg_key = raw, "mixed", key
        # The prefiller hands its KV over once: a decode leg that reached an instance and
        # failed is not sent again as it is (it would wait for a transfer that is gone).
        once = cfg.mode == "pd" and bool(cfg.p2p)
        inst, resp = await _open(
            state, role, "requests", leg_key, tokens, path, payload, headers, once, avoid
        )
        try:
            first = await resp.content.readany()
        except UPSTREAM_ERRORS as exc:
            resp.close()
            inst.release(tokens)
            record_failure(inst, cfg.unhealthy_after)
            avoid.append(inst)
            last = LegFailed(
                502, f"{role} instance {inst.url} failed before its first token: {_why(exc)}", "upstream"
            )
            if attempt < cfg.retries:
                state.metrics.first_token_retries[role] += 1
            continue
        except BaseException:  # cancelled: the client went away
            resp.close()
            inst.release(tokens)
            raise
        if prefilled and body.get("stream") is True and resp.status == 200:
            # the KV handover as the client feels it: the prefill's answer to decode's first token
            state.metrics.kv_handover.observe(asyncio.get_running_loop().time() - prefill_ended)
        return inst, resp, first
    assert last is not None
    raise last


class _Answered(Exception):
    """The prefiller refused the request (4xx): its answer goes to the client as it is."""

    def __init__(self, response: web.Response) -> None:
        super().__init__("answered")
        self.response = response


async def _prefill(
    state: ProxyState,
    body: dict[str, Any],
    path: str,
    tokens: int,
    key: bytes | None,
    headers: dict[str, str],
) -> tuple[dict[str, Any] | None, float]:
    """Run the prefill leg; return the prefiller's kv_transfer_params (None when it gave none)
    and when its answer had come (the event loop's clock)."""
    loop = asyncio.get_running_loop()
    t = loop.time()
    p2p = state.config.p2p
    transfer_id = f"xfer-{uuid.uuid4().hex}" if p2p == "mooncake" else None
    payload = rewrite.prefill_payload(body, p2p=p2p, transfer_id=transfer_id)
    inst, resp = await _open(state, "prefill", "tokens", key, tokens, path, payload, headers)
    try:
        data = await resp.read()
    except UPSTREAM_ERRORS as exc:
        record_failure(inst, state.config.unhealthy_after)
        raise LegFailed(
            502, f"prefill instance {inst.url} failed mid-answer: {_why(exc)}", "upstream"
        ) from None
    finally:
        resp.close()
        inst.release(tokens)
    if resp.status != 200:
        ctype = resp.headers.get("Content-Type", "application/json")
        state.metrics.errors["upstream_refused"] += 1
        raise _Answered(web.Response(status=resp.status, body=data, headers={"Content-Type": ctype}))
    ended = loop.time()
    state.metrics.prefill.observe(ended - t)
    if transfer_id is not None:
        # vLLM's MooncakeConnector returns no params: decode pulls this transfer from the engine
        # the prefiller's bootstrap server names.
        bootstrap = state.bootstrap_of[inst.url]
        engine = await _mooncake_engine(state, inst.url, bootstrap)
        return rewrite.mooncake_decode_params(transfer_id, engine, bootstrap), ended
    return rewrite.kv_params_of(data), ended


ENGINE_TTL_S = 1.0  # a restarted prefiller registers a new engine id; it is healthy much later


async def _mooncake_engine(state: ProxyState, url: str, bootstrap: str) -> str:
    """The engine id behind prefiller `url`, from its bootstrap server (cached for a second)."""
    loop = asyncio.get_running_loop()
    cached = state.engines.get(url)
    if cached is not None and loop.time() - cached[0] < ENGINE_TTL_S:
        return cached[1]
    assert state.session is not None
    try:
        async with state.session.get(
            bootstrap + "/query", timeout=aiohttp.ClientTimeout(total=state.config.connect_timeout)
        ) as resp:
            answer = await resp.read()
            if resp.status != 200:
                raise ValueError(f"HTTP {resp.status}")
        engine = rewrite.engine_of(answer)
    except (*UPSTREAM_ERRORS, ValueError) as exc:
        state.metrics.errors["bootstrap"] += 1
        raise LegFailed(
            502,
            f"prefill instance {url}: Mooncake bootstrap {bootstrap} gave no engine: {_why(exc)}",
            "upstream",
        ) from None
    state.engines[url] = (loop.time(), engine)
    return engine


async def _open(
    state: ProxyState,
    role: str,
    by: LoadKind,
    key: bytes | None,
    tokens: int,
    path: str,
    payload: bytes,
    headers: dict[str, str],
    once: bool = False,
    avoid: list[Instance] | None = None,
) -> tuple[Instance, aiohttp.ClientResponse]:
    """Send a leg to the best instance, retrying others with backoff, until one answers below 500.

    The caller owns the returned response and the instance's in-flight count (`release(tokens)`).
    With `once`, only a leg that reached no instance (nothing listening) is tried elsewhere.
    Instances in `avoid` (they failed this request already) are taken only when no other is left.
    """
    cfg, pool, session = state.config, state.pool, state.session
    assert session is not None
    tried: list[Instance] = list(avoid or ())
    last: LegFailed | None = None
    for attempt in range(cfg.retries + 1):
        inst = _pick(pool, role, by, tried, key)
        if inst is None:
            break
        if attempt:
            state.metrics.retries[role] += 1
        tried.append(inst)
        inst.acquire(tokens)
        try:
            resp = await session.post(
                inst.endpoint(path), data=payload, headers=headers, timeout=state.timeout()
            )
        except aiohttp.ClientConnectorError as exc:  # nothing listens there: out of routing at once
            inst.release(tokens)
            record_failure(inst, cfg.unhealthy_after, refused=True)
            last = LegFailed(503, f"{role} instance {inst.url} is unreachable: {_why(exc)}", "upstream")
        except UPSTREAM_ERRORS as exc:
            inst.release(tokens)
            record_failure(inst, cfg.unhealthy_after)
            last = LegFailed(502, f"{role} instance {inst.url} failed: {_why(exc)}", "upstream")
            if once:
                break
        except BaseException:  # cancelled: the client went away
            inst.release(tokens)
            raise
        else:
            if resp.status < 500:
                record_success(inst)
                return inst, resp
            text = await _short_body(resp)
            inst.release(tokens)
            record_failure(inst, cfg.unhealthy_after)
            last = LegFailed(502, f"{role} instance {inst.url} answered {resp.status}: {text}", "upstream")
            if once:
                break
        if attempt < cfg.retries:
            await asyncio.sleep(cfg.retry_backoff * 2**attempt)
    if last is None:
        raise LegFailed(503, f"no healthy {role} instance", "no_instance")
    raise last


def _pick(pool: Pool, role: str, by: LoadKind, tried: list[Instance], key: bytes | None) -> Instance | None:
    """Prefer an instance not tried yet; a tried one that is still healthy is better than none."""
    return pool.pick(role, by, exclude=tried, affinity_key=key) or (
        pool.pick(role, by, affinity_key=key) if tried else None
    )


async def _short_body(resp: aiohttp.ClientResponse) -> str:
    try:
        return (await resp.read())[:300].decode(errors="replace").strip()
    except UPSTREAM_ERRORS as exc:
        return _why(exc)
    finally:
        resp.close()


async def _relay(
    request: web.Request,
    state: ProxyState,
    inst: Instance,
    resp: aiohttp.ClientResponse,
    first: bytes,
    stream: bool,
    t0: float,
    rid: str,
) -> web.StreamResponse:
    """Copy the upstream's answer to the client read by read (`first` already read): no
    buffering, no parsing."""
    metrics = state.metrics
    loop = asyncio.get_running_loop()
    out = web.StreamResponse(status=resp.status)
    out.headers["Content-Type"] = resp.headers.get("Content-Type", "application/json")
    out.headers["X-Request-Id"] = rid
    if stream:
        out.headers["Cache-Control"] = "no-cache"
    elif resp.content_length is not None:
        out.content_length = resp.content_length
    counting = stream and resp.status == 200
    content = resp.content
    chunks = 0
    chunk = first
    if first and stream:
        metrics.ttft.observe(loop.time() - t0)
    try:
        await out.prepare(request)
        while chunk:
            if counting:
                # one SSE event per token: a substring count is cheap, parsing each chunk is not
                chunks += chunk.count(b"data:")
            await out.write(chunk)
            try:
                chunk = await content.readany()
            except UPSTREAM_ERRORS as exc:
                await _upstream_broke(request, state, inst, exc, out, stream, chunk)
                return out
        await out.write_eof()
    except ConnectionError:  # the client went away mid-answer; the caller closes the upstream
        metrics.errors["client_disconnect"] += 1
        return out
    finally:
        inst.output_chunks_total += chunks
    metrics.latency.observe(loop.time() - t0)
    return out


async def _upstream_broke(
    request: web.Request,
    state: ProxyState,
    inst: Instance,
    exc: BaseException,
    out: web.StreamResponse,
    stream: bool,
    sent: bytes,
) -> None:
    """The upstream failed after tokens went out: the answer is not sent again (the client has
    part of it). A stream gets an error event the client's SSE parser reads (as vLLM sends its
    own errors), then the connection ends without the chunked body's end, so no client can
    take the cut answer for a complete one."""
    state.metrics.errors["upstream_mid_stream"] += 1
    record_failure(inst, state.config.unhealthy_after)
    log.warning("%s instance %s failed mid-stream: %s", inst.role, inst.url, _why(exc))
    if stream:
        # the exception's own words (aiohttp's payload errors run to hundreds of characters)
        # go to the proxy's log; the client is told what happened
        why = type(exc).__name__
        message = f"{inst.role} instance {inst.url} failed mid-stream ({why}): the answer is incomplete"
        event = {"error": {"message": message, "type": "upstream_error", "code": 502}}
        # after a cut event, two newlines end it first, so the error event is read alone
        head = b"" if sent.endswith(b"\n\n") else b"\n\n"
        with contextlib.suppress(ConnectionError):
            await out.write(head + b"data: " + json.dumps(event).encode() + b"\n\n")
    if request.transport is not None:
        request.transport.close()  # flushes what was written, then closes: no clean end of body


def _why(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    return text.splitlines()[0][:200] if text else type(exc).__name__
