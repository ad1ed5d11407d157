"""The request path: prefill leg with retries, then the decode (or mixed) leg relayed as it arrives.
Which instance takes a leg is the routing policy's (ucmctl.proxy.routing); how the KV goes from
the prefill leg to the decode leg is the handoff's (ucmctl.proxy.handoff)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import uuid
from collections.abc import Sequence
from typing import Any

import aiohttp
from aiohttp import web

from ucmctl.proxy import resume, rewrite, whole
from ucmctl.proxy.health import log, record_failure, record_success
from ucmctl.proxy.jsontext import Texts
from ucmctl.proxy.kv_index import block_keys, ids_keys
from ucmctl.proxy.leg import Leg, Sending
from ucmctl.proxy.pool import Instance
from ucmctl.proxy.routing import Ask
from ucmctl.proxy.state import ProxyState, Request, error_response, session_of
from ucmctl.proxy.upstream import UPSTREAM_ERRORS, LegFailed, why

__all__ = ["UPSTREAM_ERRORS", "LegFailed", "serve_generate"]


async def serve_generate(request: web.Request, state: ProxyState, path: str) -> web.StreamResponse:
    """Serve one completion or chat request: prefill (pd mode) then the relayed answer."""
    cfg, metrics = state.config, state.metrics
    t0 = asyncio.get_running_loop().time()
    metrics.requests[path] += 1
    raw = await request.read()
    rid = request.headers.get("X-Request-Id") or uuid.uuid4().hex
    try:
        body, texts = rewrite.parse_body(raw, path)
    except rewrite.BadRequest as exc:
        metrics.errors["bad_request"] += 1
        return error_response(400, str(exc), rid)
    tokens = rewrite.prompt_tokens(body, path)
    prefix = rewrite.prefix_key(body, path, cfg.affinity_tokens) if state.policy.needs_prefix else None
    headers = {**state.upstream_headers, "X-Request-Id": rid}
    blocks: Sequence[int] = ()
    if state.policy.needs_blocks or state.index is not None:
        tokens, blocks = await _blocks(state, body, texts, path, tokens, headers)
    refused = resume.refusal(body, path) if cfg.migrations else "migrations are off"
    answer = None
    if refused is None:  # the legs that generate return token ids: a cut answer can go on
        answer = resume.Answer.of(body, path)
        if answer.whole:  # and stream: the client gets the answer whole, assembled here
            body = whole.streamed(body)
        raw, body = resume.with_token_ids(body, texts)
    req = Request(raw, body, path, tokens, headers, prefix, session_of(request, body), blocks, texts)
    try:
        inst, resp, first = await _answer(state, req)
    except LegFailed as exc:
        metrics.errors[exc.reason] += 1
        return error_response(exc.status, exc.message, rid)
    except _Answered as answered:
        return answered.response
    leg = Leg(inst, resp, tokens, first)
    try:
        return await _relay(request, state, req, leg, t0, rid, answer, refused)
    finally:
        leg.end()


async def _blocks(
    state: ProxyState, body: dict[str, Any], texts: Texts, path: str, tokens: int, headers: dict[str, str]
) -> tuple[int, Sequence[int]]:
    """The prompt's length and its full blocks' keys: of its exact token ids where the prompt is
    text an instance tokenized, else of the prompt as sent (the length as estimated)."""
    block_size = state.config.block_size
    if state.tokenizer is not None:
        assert state.session is not None
        ids = await state.tokenizer.ids(state.session, body, path, headers)
        if ids is not None:
            return len(ids), ids_keys(ids, str(body.get("model", "")), block_size)
    return tokens, block_keys(body, path, block_size, texts)


async def _answer(
    state: ProxyState, req: Request, avoid: list[Instance] | None = None, *, resumed: bool = False
) -> tuple[Instance, aiohttp.ClientResponse, bytes]:
    """The upstream whose answer goes to the client, and the answer's first bytes.

    Nothing goes to the client before those bytes came: an upstream that dies before its first
    token is tried again on another instance of its role (the client has seen nothing of it).
    The handoff says whether the prefill runs again (P2P: the prefiller handed its KV to the
    instance that died) or not (the store keeps it). A continuation (`resumed`) goes straight to
    a decode instance where the store holds its KV; instances in `avoid` failed it already.
    """
    cfg, handoff = state.config, state.handoff
    pd = cfg.mode == "pd"
    decode, path = state.decode_first(req) if pd and not resumed else (None, None)
    if pd and not resumed:
        state.metrics.paths[path or "disaggregated"] += 1
    direct = path is not None or (pd and resumed and not handoff.once)
    avoid = list(avoid or ())
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
                rewrite.decode_payload(req.raw, req.body, kv_params, req.texts),
                req.ask("decode", cfg, first_leg=False),
            )
        else:
            payload, ask = req.raw, req.ask("mixed", cfg, first_leg=True)
        # A P2P transfer is handed over once: a decode leg that reached an instance and failed is
        # not sent again as it is (it would wait for a transfer that is gone).
        leg_started = asyncio.get_running_loop().time()
        prefer = decode if not attempt else None  # the decode instance chosen already, if any
        inst, resp = await _open(state, ask, req, payload, pd and handoff.once, avoid, prefer)
        inst.first_waits[resp] = leg_started  # a stall of the instance cuts it (proxy/stall)
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
        finally:
            inst.first_waits.pop(resp, None)
        inst.answered(req.tokens)
        inst.output_at = asyncio.get_running_loop().time()  # a first token, or a whole answer
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
    payload, transfer = state.handoff.prefill_leg(req.body, req.texts)
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
    ended = inst.output_at = loop.time()  # it answered (proxy/stall)
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
            post = session.post(
                inst.endpoint(req.path), data=payload, headers=req.headers, timeout=state.timeout()
            )
            resp = await Sending().to(inst, post)
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
    req: Request,
    leg: Leg,
    t0: float,
    rid: str,
    answer: resume.Answer | None,
    refused: str | None,
) -> web.StreamResponse:
    """Copy the upstream's answer to the client read by read: no buffering, and no parsing but
    the token ids of an answer that may be continued (`answer`; one the client wants whole is
    assembled and sent at its end). One cut mid-stream goes on on another instance where it can
    (`refused`: why it cannot)."""
    metrics = state.metrics
    loop = asyncio.get_running_loop()
    resp = leg.resp
    stream = req.body.get("stream") is True  # the upstream's (also for a whole answer, see `whole`)
    counting = stream and resp.status == 200
    if not counting:
        answer = None  # only a streamed answer is continued
    out: web.StreamResponse | whole.Body
    if answer is not None and answer.whole:
        out = whole.Body(answer)
    else:
        out = _Relayed(status=resp.status)
        out.headers["Content-Type"] = resp.headers.get("Content-Type", "application/json")
        out.headers["X-Request-Id"] = rid
        if stream:
            out.headers["Cache-Control"] = "no-cache"
        elif resp.content_length is not None:
            out.content_length = resp.content_length
        if leg.first and stream:
            metrics.ttft.observe(loop.time() - t0)
    if answer is not None:
        leg.hold(answer)
    if counting:
        leg.watch(loop.time(), None if isinstance(out, whole.Body) else request.transport)
    try:
        await out.prepare(request)
        broke = await _pump(out, leg, answer, counting=counting)
        while broke is not None:
            if answer is not None and answer.complete():  # only its end was lost
                await out.write(answer.ending())
                break
            if not await _continue(request, state, req, leg, out, answer, broke, refused):
                return _sent(out, rid)
            broke = await _pump(out, leg, answer, counting=counting, continued=True)
        await out.write_eof()
    except ConnectionError:  # the client went away mid-answer; the caller closes the upstream
        metrics.errors["client_disconnect"] += 1
        return _sent(out, rid)
    metrics.latency.observe(loop.time() - t0)
    return _sent(out, rid)


class _Relayed(web.StreamResponse):
    """A relayed answer: its headers go out with its first bytes, in one write, not in a write of
    their own before them (the first bytes are at hand when it starts: one write and one read of
    the client's less before its first token)."""

    _send_headers_immediately = False  # aiohttp's switch (its `Response` sets it so too)


def _sent(out: web.StreamResponse | whole.Body, rid: str) -> web.StreamResponse:
    """What went to the client: the stream relayed, or a whole answer's one response."""
    return out.response(rid) if isinstance(out, whole.Body) else out


class _EngineError(Exception):
    """The engine streamed an error event: the answer cannot go on there."""


class Stalled(Exception):
    """The instance sent no token for the stall timeout: its answers were cut there."""


async def _pump(
    out: web.StreamResponse | whole.Body,
    leg: Leg,
    answer: resume.Answer | None,
    *,
    counting: bool,
    continued: bool = False,
) -> BaseException | None:
    """Copy `leg`'s answer to the client from its first bytes on; the failure that cut it, None
    when it ended. An `answer` reads the token ids off each event (and sends only whole events)."""
    loop = asyncio.get_running_loop()
    content = leg.resp.content
    chunks = 0
    chunk = leg.first
    try:
        while chunk:
            data = chunk if answer is None else answer.feed(chunk, continued=continued)
            if counting:
                # one SSE event per token: a substring count is cheap, parsing each chunk is not
                chunks += data.count(b"data:")
            if data:
                leg.wrote_at = leg.inst.output_at = loop.time()  # it steps (proxy/stall watches this)
                leg.clean = data.endswith(b"\n\n")
                await out.write(data)
            if answer is not None and answer.broke:
                return _EngineError(answer.broke[6:300].decode(errors="replace"))
            try:
                chunk = await content.readany()
            except UPSTREAM_ERRORS as exc:
                return exc
    finally:
        leg.inst.output_chunks_total += chunks
    if answer is not None:
        answer.settle()
    if answer is not None and not (answer.done or answer.finished):
        return aiohttp.ClientPayloadError("the stream ended before its last event")
    return None


async def _continue(
    request: web.Request,
    state: ProxyState,
    req: Request,
    leg: Leg,
    out: web.StreamResponse | whole.Body,
    answer: resume.Answer | None,
    broke: BaseException,
    refused: str | None,
) -> bool:
    """The answer's upstream broke mid-stream: go on on another instance (True: `leg` is the
    continuation's now), or end the client's stream with an error that says why not (False)."""
    cfg, metrics = state.config, state.metrics
    dead = leg.inst
    cause = leg.moved or "failure"
    if cause == "stall":  # cut here: its instance stopped sending (proxy/stall), a failure too
        broke = Stalled(f"no token for {cfg.stall_timeout:g} s")
    if cause != "drain":
        metrics.errors["upstream_mid_stream"] += 1
    if not leg.moved:
        record_failure(dead, cfg.unhealthy_after)
        log.warning("%s instance %s failed mid-stream: %s", dead.role, dead.url, why(broke))
    why_not = _why_not(cfg.migrations, answer, refused)
    if answer is None or why_not:
        metrics.migrations["not_continued", cause] += 1
        await _upstream_broke(request, dead, broke, out, leg.clean, f"not continued: {why_not}")
        return False
    answer.migrations += 1
    raw, body = answer.continuation(req.body, req.path)
    ids = body["prompt"]
    blocks = ids_keys(ids, str(body.get("model", "")), cfg.block_size) if state.index is not None else ()
    cont_req = Request(raw, body, rewrite.COMPLETIONS, len(ids), req.headers, None, req.session, blocks)
    try:
        inst, resp, first = await _answer(state, cont_req, [dead], resumed=True)
    except asyncio.CancelledError:  # the client went away meanwhile: its continuation goes too
        metrics.migrations["cancelled", cause] += 1
        metrics.errors["client_disconnect"] += 1
        raise
    except (LegFailed, _Answered) as exc:
        metrics.migrations["failed", cause] += 1
        message = exc.message if isinstance(exc, LegFailed) else "a prefill instance refused it"
        await _upstream_broke(request, dead, broke, out, leg.clean, f"its continuation failed: {message}")
        return False
    leg.swap(inst, resp, len(ids), first, asyncio.get_running_loop().time())
    if resp.status != 200:  # the instance refused it: context too long, model gone, ...
        metrics.migrations["failed", cause] += 1
        text = (first.decode(errors="replace") + await _short_body(resp))[:300].strip()
        why_refused = f"{inst.url} refused its continuation: {text}"
        await _upstream_broke(request, dead, broke, out, leg.clean, why_refused)
        return False
    metrics.migrations["resumed", cause] += 1
    metrics.migration_gap.observe(asyncio.get_running_loop().time() - leg.wrote_at)
    rid = req.headers.get("X-Request-Id")
    log.warning("answer %s goes on on %s after %d tokens", rid, inst.url, len(answer.ids))
    return True


def _why_not(migrations: int, answer: resume.Answer | None, refused: str | None) -> str | None:
    """Why a cut answer does not go on elsewhere, None when it can."""
    if answer is None:
        return refused or "it cannot be continued"
    if not answer.resumable():
        return "the engine returned no token ids"
    if answer.migrations >= migrations:
        return f"it moved {answer.migrations} time(s) already (proxy migrations: {migrations})"
    return None


async def _upstream_broke(
    request: web.Request,
    inst: Instance,
    exc: BaseException,
    out: web.StreamResponse | whole.Body,
    clean: bool,
    why_not: str,
) -> None:
    """The upstream failed after tokens went out and the answer does not go on elsewhere: it is
    not sent again (the client has part of it). A stream gets an error event the client's SSE
    parser reads (as vLLM sends its own errors), then the connection ends without the chunked
    body's end, so no client can take the cut answer for a complete one."""
    # the exception's own words (aiohttp's payload errors run to hundreds of characters) go to the
    # proxy's log; the client is told what happened
    kind = type(exc).__name__ + (f": {exc}" if isinstance(exc, Stalled) else "")
    message = (
        f"{inst.role} instance {inst.url} failed mid-stream ({kind}): the answer is incomplete ({why_not})"
    )
    if isinstance(out, whole.Body):  # nothing of it went out: an error instead of the answer
        out.fail(message)
        return
    if out.headers.get("Cache-Control") == "no-cache":  # streamed
        event = {"error": {"message": message, "type": "upstream_error", "code": 502}}
        # after a cut event, two newlines end it first, so the error event is read alone
        head = b"" if clean else b"\n\n"
        with contextlib.suppress(ConnectionError):
            await out.write(head + b"data: " + json.dumps(event).encode() + b"\n\n")
    if request.transport is not None:
        request.transport.close()  # flushes what was written, then closes: no clean end of body
