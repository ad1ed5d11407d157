"""The request path: prefill leg with retries, then the decode (or mixed) leg relayed as it arrives.
Which instance takes a leg is the routing policy's (ucmctl.proxy.routing); how the KV goes from
the prefill leg to the decode leg is the handoff's (ucmctl.proxy.handoff)."""

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
from ucmctl.proxy.config import ProxyConfig
from ucmctl.proxy.handoff import Handoff, Store, make_handoff
from ucmctl.proxy.health import log, record_failure, record_success
from ucmctl.proxy.kv_feed import Feed
from ucmctl.proxy.kv_index import KvIndex, block_keys, ids_keys
from ucmctl.proxy.metrics import Metrics
from ucmctl.proxy.pool import Instance, Pool
from ucmctl.proxy.routing import POLICIES, Ask, Policy, canonical, make_policy
from ucmctl.proxy.tokenize import Tokenizer
from ucmctl.proxy.upstream import UPSTREAM_ERRORS, LegFailed, why

__all__ = ["UPSTREAM_ERRORS", "LegFailed", "ProxyState", "error_response", "serve_generate"]

# selective disaggregation: a prefill instance with this many legs not answered is saturated
SATURATED_LEGS = 2


@dataclass
class ProxyState:
    """What every handler shares: settings, instances, routing, metrics and the one client session."""

    config: ProxyConfig
    pool: Pool = field(default_factory=Pool)
    policy: Policy = field(default_factory=lambda: make_policy("least-loaded"))
    index: KvIndex | None = None  # where prompts' blocks are: for kv routing and direct decodes
    handoff: Handoff = field(default_factory=Store)
    metrics: Metrics = field(default_factory=Metrics)
    session: aiohttp.ClientSession | None = None
    upstream_headers: dict[str, str] = field(default_factory=dict)
    feeds: list[Feed] = field(default_factory=list)  # the instances' KV-cache events into the index
    tokenizer: Tokenizer | None = None  # text prompts' exact token ids, where the index is read

    @classmethod
    def create(cls, config: ProxyConfig) -> ProxyState:
        """The state for `config`, every configured instance in routing."""
        needs_blocks = POLICIES[canonical(config.routing) or config.routing].needs_blocks
        index = KvIndex() if needs_blocks or config.direct_below else None
        policy = make_policy(config.routing, config.block_size, index, store=config.kv_store)
        state = cls(config, pool=Pool(config.dynamic_roles), policy=policy, index=index)
        for role, urls in (
            ("prefill", config.prefillers),
            ("decode", config.decoders),
            ("mixed", config.instances),
        ):
            for url in urls:
                state.pool.add(url, role)
        if index is not None:
            model = config.served_model or ""
            feeds = config.kv_events
            state.feeds = [Feed(url, endpoint, model, state.pool, index) for url, endpoint in feeds]
            state.tokenizer = Tokenizer(state.pool) if config.tokenize else None
        bootstrap_of = dict(zip(config.prefillers, config.bootstraps, strict=False))
        state.handoff = make_handoff(config.p2p, bootstrap_of, state.metrics, config.connect_timeout)
        # identity: relay the upstream's bytes as they are, no decompress and recompress
        state.upstream_headers = {"Content-Type": "application/json", "Accept-Encoding": "identity"}
        if config.upstream_api_key:
            state.upstream_headers["Authorization"] = f"Bearer {config.upstream_api_key}"
        return state

    def routing_facts(self) -> dict[str, object]:
        """The policy's own facts, and where the index learns what each instance's cache holds."""
        facts = self.policy.describe()
        if self.feeds and "index" in facts:
            n = len(self.feeds)
            facts["index"] = f"vLLM KV events of {n} instances, with the proxy's routing history"
            facts["kv_events"] = [vars(f.stats).copy() for f in self.feeds]
        if "index" in facts:
            facts["tokenization"] = (
                self.tokenizer.describe() if self.tokenizer else {"source": "estimated (--no-tokenize)"}
            )
        return facts

    def timeout(self) -> aiohttp.ClientTimeout:
        """Per-leg timeouts: bounded connect and silence, no bound on a long generation."""
        cfg = self.config
        return aiohttp.ClientTimeout(
            total=None, sock_connect=cfg.connect_timeout, sock_read=cfg.read_timeout or None
        )

    def pick(self, ask: Ask, exclude: list[Instance] | tuple[Instance, ...] = ()) -> Instance | None:
        """The instance for a leg, by the routing policy; None when no candidate is left."""
        cands = self.pool.candidates(ask.role, exclude)
        return self.policy.choose(cands, ask) if cands else None

    def sent(self, inst: Instance, ask: Ask) -> None:
        """A leg that computes the prompt went to `inst`: its blocks count as held there from now
        on (a request routed after it finds them computed, or computing ahead of it in the same
        engine), not as stored yet."""
        if self.index is not None and ask.blocks and ask.role != "decode":
            self.index.took(ask.blocks, inst, saved=False)

    def took(self, inst: Instance, ask: Ask, seconds: float, *, saved: bool) -> None:
        """A leg came back well: the policy learns of it, and the index has the prompt's blocks
        in the instance's own cache now (and in the store, `saved`)."""
        self.policy.done(inst, ask, seconds)
        if self.index is not None and ask.blocks:
            self.index.took(ask.blocks, inst, saved=saved)

    def decode_first(self, req: Request) -> tuple[Instance | None, str | None]:
        """pd with the store and `direct_below`: the decode instance for `req`, chosen before
        its prefill, and why it takes `req` alone (it prefills what it has not cached, in its
        own cache or the store), None where it does not. Only a decode instance computing no
        prompt now takes one (at most one prefill at a time among its streams): "direct", fewer
        tokens to compute than `direct_below`; "direct_saturated", every prefill instance has a
        leg queued behind the one it computes. (None, None) where the decode instance is chosen
        after the prefill, as without."""
        cfg = self.config
        if not cfg.direct_below or self.index is None or self.handoff.once or not req.blocks:
            return None, None
        decode = self.pick(req.ask("decode", cfg, first_leg=False))
        if decode is None:
            return None, None
        if decode.pending:  # a prompt computing there already: its streams would wait on two
            return decode, None
        (held,), stored = self.index.leading(req.blocks, [decode])
        cached = max(held, stored) * cfg.block_size
        if req.tokens - cached < cfg.direct_below:
            return decode, "direct"
        return decode, "direct_saturated" if self._prefill_saturated(decode) else None

    def _prefill_saturated(self, decode: Instance) -> bool:
        """Every prefill instance in routing (but `decode`) has SATURATED_LEGS legs or more not
        answered yet: one it computes, one queued behind."""
        prefills = self.pool.candidates("prefill", [decode])
        return bool(prefills) and all(i.pending >= SATURATED_LEGS for i in prefills)

    def remove(self, url: str, role: str | None = None) -> list[Instance]:
        """Take instances out of the pool and out of the policy's memory."""
        gone = self.pool.remove(url, role)
        self.policy.forget(gone)
        return gone


@dataclass(frozen=True)
class Request:
    """A client's request as the legs need it."""

    raw: bytes
    body: dict[str, Any]
    path: str
    tokens: int
    headers: dict[str, str]
    prefix: bytes | None = None  # the affinity key, where the policy reads one
    session: str | None = None  # the conversation
    blocks: tuple[int, ...] = ()  # the prompt's blocks, where the policy reads them

    def ask(self, role: str, config: ProxyConfig, *, first_leg: bool) -> Ask:
        """The leg of `role`; the prompt's prefix key goes with the leg that computes the prompt."""
        prefix = self.prefix if first_leg else None
        return Ask(role, config.load(role), self.tokens, prefix, self.session, self.blocks)


def error_response(status: int, message: str, rid: str | None = None) -> web.Response:
    """An OpenAI-style JSON error."""
    kind = "invalid_request_error" if status < 500 else "upstream_error"
    body = {"error": {"message": message, "type": kind, "code": status}}
    headers = {"X-Request-Id": rid} if rid else None
    return web.json_response(body, status=status, headers=headers)


def session_of(request: web.Request, body: dict[str, Any]) -> str | None:
    """The conversation a request belongs to: its `X-Session-Id` header, else the OpenAI `user`."""
    header = request.headers.get("X-Session-Id")
    if header:
        return header
    user = body.get("user")
    return user if isinstance(user, str) and user else None


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
    prefix = rewrite.prefix_key(body, path, cfg.affinity_tokens) if state.policy.needs_prefix else None
    headers = {**state.upstream_headers, "X-Request-Id": rid}
    blocks: tuple[int, ...] = ()
    if state.policy.needs_blocks or state.index is not None:
        tokens, blocks = await _blocks(state, body, path, tokens, headers)
    req = Request(raw, body, path, tokens, headers, prefix, session_of(request, body), blocks)
    try:
        inst, resp, first = await _answer(state, req)
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


async def _blocks(
    state: ProxyState, body: dict[str, Any], path: str, tokens: int, headers: dict[str, str]
) -> tuple[int, tuple[int, ...]]:
    """The prompt's length and its full blocks' keys: of its exact token ids where the prompt is
    text an instance tokenized, else of the prompt as sent (the length as estimated)."""
    block_size = state.config.block_size
    if state.tokenizer is not None:
        assert state.session is not None
        ids = await state.tokenizer.ids(state.session, body, path, headers)
        if ids is not None:
            return len(ids), ids_keys(ids, str(body.get("model", "")), block_size)
    return tokens, block_keys(body, path, block_size)


async def _answer(state: ProxyState, req: Request) -> tuple[Instance, aiohttp.ClientResponse, bytes]:
    """The upstream whose answer goes to the client, and the answer's first bytes.

    Nothing goes to the client before those bytes came: an upstream that dies before its first
    token is tried again on another instance of its role (the client has seen nothing of it).
    The handoff says whether the prefill runs again (P2P: the prefiller handed its KV to the
    instance that died) or not (the store keeps it).
    """
    cfg, handoff = state.config, state.handoff
    pd = cfg.mode == "pd"
    decode, path = state.decode_first(req) if pd else (None, None)
    direct = path is not None
    if pd:
        state.metrics.paths[path or "disaggregated"] += 1
    avoid: list[Instance] = []
    kv_params: dict[str, Any] | None = None
    prefilled = False
    prefill_ended = 0.0
    last: LegFailed | None = None
    for attempt in range(cfg.retries + 1):
        if attempt:
            await asyncio.sleep(cfg.retry_backoff * 2 ** (attempt - 1))
        if direct:  # the decode instance computes what it has not cached itself
            payload, ask = req.raw, req.ask("decode", cfg, first_leg=False)
        elif pd:
            if not prefilled or handoff.prefill_again:
                kv_params, prefill_ended = await _prefill(state, req)
                prefilled = True
            payload, ask = (
                rewrite.decode_payload(req.raw, req.body, kv_params),
                req.ask("decode", cfg, first_leg=False),
            )
        else:
            payload, ask = req.raw, req.ask("mixed", cfg, first_leg=True)
        # A P2P transfer is handed over once: a decode leg that reached an instance and failed is
        # not sent again as it is (it would wait for a transfer that is gone).
        leg_started = asyncio.get_running_loop().time()
        prefer = decode if not attempt else None  # the decode instance chosen already, if any
        inst, resp = await _open(state, ask, req, payload, pd and handoff.once, avoid, prefer)
        try:
            first = await resp.content.readany()
        except UPSTREAM_ERRORS as exc:
            resp.close()
            inst.release(req.tokens, answered=False)
            record_failure(inst, cfg.unhealthy_after)
            avoid.append(inst)
            last = LegFailed(
                502, f"{ask.role} instance {inst.url} failed before its first token: {why(exc)}", "upstream"
            )
            if attempt < cfg.retries:
                state.metrics.first_token_retries[ask.role] += 1
            continue
        except BaseException:  # cancelled: the client went away
            resp.close()
            inst.release(req.tokens, answered=False)
            raise
        inst.answered(req.tokens)
        if resp.status == 200:
            took = asyncio.get_running_loop().time() - leg_started
            state.took(inst, ask, took, saved=direct or not pd)
        if prefilled and req.body.get("stream") is True and resp.status == 200:
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


async def _prefill(state: ProxyState, req: Request) -> tuple[dict[str, Any] | None, float]:
    """Run the prefill leg; return the decode leg's kv_transfer_params (None when there are none)
    and when the prefiller's answer had come (the event loop's clock)."""
    loop = asyncio.get_running_loop()
    t = loop.time()
    payload, transfer = state.handoff.prefill_leg(req.body)
    ask = req.ask("prefill", state.config, first_leg=True)
    inst, resp = await _open(state, ask, req, payload)
    answered = False
    try:
        data = await resp.read()
        inst.answered(req.tokens)
        answered = True
    except UPSTREAM_ERRORS as exc:
        record_failure(inst, state.config.unhealthy_after)
        raise LegFailed(
            502, f"prefill instance {inst.url} failed mid-answer: {why(exc)}", "upstream"
        ) from None
    finally:
        resp.close()
        inst.release(req.tokens, answered=answered)
    if resp.status != 200:
        ctype = resp.headers.get("Content-Type", "application/json")
        state.metrics.errors["upstream_refused"] += 1
        raise _Answered(web.Response(status=resp.status, body=data, headers={"Content-Type": ctype}))
    ended = loop.time()
    state.metrics.prefill.observe(ended - t)
    state.took(inst, ask, ended - t, saved=True)
    assert state.session is not None
    return await state.handoff.decode_params(state.session, inst, data, transfer), ended


async def _open(
    state: ProxyState,
    ask: Ask,
    req: Request,
    payload: bytes,
    once: bool = False,
    avoid: list[Instance] | None = None,
    prefer: Instance | None = None,
) -> tuple[Instance, aiohttp.ClientResponse]:
    """Send a leg to the instance the policy picks, retrying others with backoff, until one
    answers below 500.

    The caller owns the returned response and the instance's in-flight count (`release(tokens)`).
    With `once`, only a leg that reached no instance (nothing listening) is tried elsewhere.
    Instances in `avoid` (they failed this request already) are taken only when no other is left;
    `prefer`, chosen already, is tried first while it is a candidate.
    """
    cfg, session, role, tokens = state.config, state.session, ask.role, req.tokens
    assert session is not None
    tried: list[Instance] = list(avoid or ())
    last: LegFailed | None = None
    for attempt in range(cfg.retries + 1):
        # prefer an instance not tried yet; a tried one that is still healthy is better than none
        if prefer is not None and not attempt and prefer in state.pool.candidates(role, tried):
            inst: Instance | None = prefer
        else:
            inst = state.pick(ask, tried) or (state.pick(ask) if tried else None)
        if inst is None:
            break
        if attempt:
            state.metrics.retries[role] += 1
        tried.append(inst)
        inst.acquire(tokens)
        state.sent(inst, ask)
        try:
            resp = await session.post(
                inst.endpoint(req.path), data=payload, headers=req.headers, timeout=state.timeout()
            )
        except aiohttp.ClientConnectorError as exc:  # nothing listens there: out of routing at once
            inst.release(tokens, answered=False)
            record_failure(inst, cfg.unhealthy_after, refused=True)
            last = LegFailed(503, f"{role} instance {inst.url} is unreachable: {why(exc)}", "upstream")
        except UPSTREAM_ERRORS as exc:
            inst.release(tokens, answered=False)
            record_failure(inst, cfg.unhealthy_after)
            last = LegFailed(502, f"{role} instance {inst.url} failed: {why(exc)}", "upstream")
            if once:
                break
        except BaseException:  # cancelled: the client went away
            inst.release(tokens, answered=False)
            raise
        else:
            if resp.status < 500:
                record_success(inst)
                return inst, resp
            text = await _short_body(resp)
            inst.release(tokens, answered=False)
            record_failure(inst, cfg.unhealthy_after)
            last = LegFailed(502, f"{role} instance {inst.url} answered {resp.status}: {text}", "upstream")
            if once:
                break
        if attempt < cfg.retries:
            await asyncio.sleep(cfg.retry_backoff * 2**attempt)
    if last is None:
        raise LegFailed(503, f"no healthy {role} instance", "no_instance")
    raise last


async def _short_body(resp: aiohttp.ClientResponse) -> str:
    try:
        return (await resp.read())[:300].decode(errors="replace").strip()
    except UPSTREAM_ERRORS as exc:
        return why(exc)
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
    log.warning("%s instance %s failed mid-stream: %s", inst.role, inst.url, why(exc))
    if stream:
        # the exception's own words (aiohttp's payload errors run to hundreds of characters)
        # go to the proxy's log; the client is told what happened
        kind = type(exc).__name__
        message = f"{inst.role} instance {inst.url} failed mid-stream ({kind}): the answer is incomplete"
        event = {"error": {"message": message, "type": "upstream_error", "code": 502}}
        # after a cut event, two newlines end it first, so the error event is read alone
        head = b"" if sent.endswith(b"\n\n") else b"\n\n"
        with contextlib.suppress(ConnectionError):
            await out.write(head + b"data: " + json.dumps(event).encode() + b"\n\n")
    if request.transport is not None:
        request.transport.close()  # flushes what was written, then closes: no clean end of body
