"""The proxy's aiohttp application: routes, API key check, and the shared client session."""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp
from aiohttp import web

from ucmctl.core.errors import ExitStatus, UcmctlError
from ucmctl.proxy import rewrite
from ucmctl.proxy.config import ProxyConfig, normalize_url
from ucmctl.proxy.flow import serve_generate
from ucmctl.proxy.health import check, health_loop, record_failure, record_success
from ucmctl.proxy.pool import Instance
from ucmctl.proxy.routing import Ask
from ucmctl.proxy.stall import stall_loop
from ucmctl.proxy.state import ProxyState, error_response
from ucmctl.proxy.upstream import UPSTREAM_ERRORS

STATE = web.AppKey("state", ProxyState)
MOVES = web.AppKey("moves", set[asyncio.Task[None]])  # drained instances' answers being moved
OPEN_PATHS = frozenset({"/health", "/metrics"})  # probes and scrapers carry no key
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def make_app(config: ProxyConfig) -> web.Application:
    """The application for `config`; its session and health checks start with it."""
    state = ProxyState.create(config)
    middlewares = [_api_key_middleware(config.api_key)] if config.api_key else []
    app = web.Application(client_max_size=config.max_body_mb * 1024 * 1024, middlewares=middlewares)
    app[STATE] = state
    app[MOVES] = set()
    app.cleanup_ctx.append(_session_ctx)
    app.router.add_post(rewrite.COMPLETIONS, _generate(rewrite.COMPLETIONS))
    app.router.add_post(rewrite.CHAT, _generate(rewrite.CHAT))
    app.router.add_get("/v1/models", models)
    app.router.add_get("/health", health)
    app.router.add_get("/metrics", metrics)
    app.router.add_post("/reset_prefix_cache", reset_prefix_cache)
    app.router.add_post("/instances/add", instances_add)
    app.router.add_post("/instances/remove", instances_remove)
    app.router.add_post("/instances/drain", instances_drain)
    app.router.add_post("/instances/resume", instances_resume)
    app.router.add_get("/instances", instances_list)
    app.router.add_get("/routing", routing)
    return app


async def _session_ctx(app: web.Application) -> AsyncIterator[None]:
    state = app[STATE]
    cfg = state.config
    # one pool for every leg: keep-alive connections are what makes the added latency small
    connector = aiohttp.TCPConnector(
        limit=cfg.max_connections, limit_per_host=0, keepalive_timeout=60, ttl_dns_cache=300
    )
    state.session = aiohttp.ClientSession(
        connector=connector, auto_decompress=False, cookie_jar=aiohttp.DummyCookieJar()
    )
    task = asyncio.create_task(
        health_loop(
            state.session,
            state.pool,
            interval=cfg.health_interval,
            timeout=cfg.health_timeout,
            unhealthy_after=cfg.unhealthy_after,
        )
    )
    tasks = [task]
    if cfg.stall_timeout:
        watch = stall_loop(
            state.session,
            state.pool,
            timeout=cfg.stall_timeout,
            model=cfg.served_model,
            headers={k: v for k, v in state.upstream_headers.items() if k == "Authorization"},
        )
        tasks.append(asyncio.create_task(watch))
    if state.feeds:
        from ucmctl.proxy.kv_feed import run_feeds  # imports ZMQ: only where events are read

        tasks.append(asyncio.create_task(run_feeds(state.feeds)))
    try:
        yield
    finally:
        for t in tasks:
            t.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await t
        await state.session.close()


def authorization_matches(header: str, expected: bytes) -> bool:
    """Whether an Authorization header carries the key, in time independent of where they differ
    (a plain == would let a client find the key byte by byte from response times)."""
    # surrogateescape: a header with bytes that are not UTF-8 is a wrong key, not an error
    return hmac.compare_digest(header.encode("utf-8", "surrogateescape"), expected)


def _api_key_middleware(key: str) -> Callable[..., Awaitable[web.StreamResponse]]:
    expected = f"Bearer {key}".encode()

    @web.middleware
    async def check_key(request: web.Request, handler: Handler) -> web.StreamResponse:
        given = request.headers.get("Authorization", "")
        if request.path not in OPEN_PATHS and not authorization_matches(given, expected):
            request.app[STATE].metrics.errors["unauthorized"] += 1
            return error_response(401, "missing or wrong API key (send Authorization: Bearer KEY)")
        return await handler(request)

    return check_key


def _generate(path: str) -> Handler:
    async def handler(request: web.Request) -> web.StreamResponse:
        return await serve_generate(request, request.app[STATE], path)

    return handler


def _serving_roles(state: ProxyState) -> tuple[str, ...]:
    return ("prefill", "decode") if state.config.mode == "pd" else ("mixed",)


async def health(request: web.Request) -> web.Response:
    """200 while every role has a healthy instance, else 503; the body lists them."""
    state = request.app[STATE]
    roles = {r: state.pool.healthy(r) for r in _serving_roles(state)}
    ok = all(n > 0 for n in roles.values())
    body = {"status": "ok" if ok else "degraded", "healthy": roles, "instances": _describe(state.pool.all())}
    return web.json_response(body, status=200 if ok else 503)


async def metrics(request: web.Request) -> web.Response:
    """Prometheus text."""
    state = request.app[STATE]
    text = state.metrics.render(state.pool.all(), state.config.deployment, state.routing_facts())
    return web.Response(
        text=text, content_type="text/plain", charset="utf-8", headers={"Cache-Control": "no-cache"}
    )


async def models(request: web.Request) -> web.Response:
    """The model list of a healthy serving instance (decode side in pd mode)."""
    state = request.app[STATE]
    state.metrics.requests["/v1/models"] += 1
    role = "decode" if state.config.mode == "pd" else "mixed"
    assert state.session is not None
    for _ in range(state.config.retries + 1):
        inst = state.pick(Ask(role, "requests"))
        if inst is None:
            break
        try:
            async with state.session.get(inst.endpoint("/v1/models"), timeout=state.timeout()) as r:
                data = await r.read()
                ctype = r.headers.get("Content-Type", "application/json")
                record_success(inst)
                return web.Response(status=r.status, body=data, headers={"Content-Type": ctype})
        except UPSTREAM_ERRORS:
            record_failure(inst, state.config.unhealthy_after, refused=True)
    state.metrics.errors["no_instance"] += 1
    return error_response(503, f"no healthy {role} instance")


async def reset_prefix_cache(request: web.Request) -> web.Response:
    """Send POST /reset_prefix_cache to every instance; 200 when all of them did it."""
    state = request.app[STATE]
    assert state.session is not None
    session = state.session
    insts = state.pool.all()

    async def one(inst: Instance) -> tuple[Instance, int | str]:
        try:
            async with session.post(inst.endpoint("/reset_prefix_cache"), timeout=state.timeout()) as r:
                await r.read()
                return inst, r.status
        except UPSTREAM_ERRORS as exc:
            return inst, str(exc) or type(exc).__name__

    results = await asyncio.gather(*(one(i) for i in insts))
    report = [{"url": i.url, "role": i.role, "result": res} for i, res in results]
    ok = all(res == 200 for _, res in results)
    return web.json_response({"ok": ok, "instances": report}, status=200 if ok else 502)


async def _instance_request(request: web.Request) -> tuple[str, str | None]:
    """The `url` and `role` of an /instances/* body, checked."""
    url, role, _ = await _instance_body(request)
    return url, role


async def _instance_body(request: web.Request) -> tuple[str, str | None, dict[str, Any]]:
    """The `url` and `role` of an /instances/* body, checked, and the body."""
    state = request.app[STATE]
    try:
        body = json.loads(await request.read() or b"null")
    except ValueError as exc:
        raise _bad(f"the body is not valid JSON: {exc}") from None
    if not isinstance(body, dict) or not isinstance(body.get("url"), str):
        raise _bad('send {"url": "http://HOST:PORT", "role": "prefill|decode|mixed"}')
    role = body.get("role")
    allowed = _serving_roles(state)
    if role is not None and role not in allowed:
        raise _bad(f"role {role!r} is not one of {', '.join(allowed)} in {state.config.mode} mode")
    try:
        url = normalize_url(body["url"], "url")
    except UcmctlError as exc:
        raise _bad(str(exc)) from None
    return url, role, body


def _bad(message: str) -> web.HTTPBadRequest:
    return web.HTTPBadRequest(
        text=json.dumps({"error": {"message": message, "type": "invalid_request_error", "code": 400}}),
        content_type="application/json",
    )


async def instances_add(request: web.Request) -> web.Response:
    """Add an instance; it is checked at once and enters routing if it answers."""
    state = request.app[STATE]
    url, role = await _instance_request(request)
    if role is None:
        if state.config.mode == "pd":
            raise _bad('say which side: "role": "prefill" or "decode"')
        role = "mixed"
    inst = state.pool.add(url, role)
    if inst is None:
        return web.json_response({"added": False, "reason": "already there", "url": url, "role": role})
    assert state.session is not None
    if not await check(state.session, inst, state.config.health_timeout):
        inst.healthy = False  # the health loop brings it in when it answers
    return web.json_response({"added": True, "url": url, "role": role, "healthy": inst.healthy})


async def instances_remove(request: web.Request) -> web.Response:
    """Take an instance out of routing; its requests in flight finish."""
    state = request.app[STATE]
    url, role = await _instance_request(request)
    gone = state.remove(url, role)
    if not gone:
        return web.json_response({"removed": False, "reason": f"no instance {url}"}, status=404)
    return web.json_response({"removed": True, "instances": _describe(gone)})


async def instances_drain(request: web.Request) -> web.Response:
    """Take an instance out of routing while it stays listed: its requests in flight finish
    (their count is in /instances), no new one goes there until /instances/resume. With
    `"move_after": SECONDS`, the answers streaming from it that can go on elsewhere move to
    other instances that long after (a restart need not wait for long generations)."""
    url, role, body = await _instance_body(request)
    move_after = body.get("move_after")
    seconds = isinstance(move_after, (int, float)) and not isinstance(move_after, bool)
    if move_after is not None and not (seconds and 0 <= move_after <= 3600):
        raise _bad(f"move_after {move_after!r} is not a number of seconds from 0 to 3600")
    state, tasks = request.app[STATE], request.app[MOVES]
    found = state.pool.find(url, role)
    if move_after is not None:
        for inst in found:
            task = asyncio.create_task(_move_off(inst, float(move_after), state.config.migrations))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
    return _set_draining(found, url, True)


MOVE_EVERY_S = 0.2  # a drained instance's answers that began streaming since the last move


async def _move_off(inst: Instance, after: float, limit: int) -> None:
    """`after` seconds on, move every answer streaming from `inst` that can go on elsewhere (it
    moved fewer than `limit` times), and those that begin streaming there later, while it is
    drained and has requests in flight."""
    await asyncio.sleep(after)
    while inst.draining and not inst.removed and inst.requests:
        for leg in list(inst.answers):
            leg.move(limit)
        await asyncio.sleep(MOVE_EVERY_S)


async def instances_resume(request: web.Request) -> web.Response:
    """Route to a drained instance again (once its health answers)."""
    url, role = await _instance_request(request)
    return _set_draining(request.app[STATE].pool.find(url, role), url, False)


def _set_draining(found: list[Instance], url: str, draining: bool) -> web.Response:
    """Drain (or resume) the instances `found` at `url`; 404 where there is none."""
    if not found:
        return web.json_response({"error": {"message": f"no instance {url}", "code": 404}}, status=404)
    for inst in found:
        inst.draining = draining
    return web.json_response({"instances": _describe(found)})


async def routing(request: web.Request) -> web.Response:
    """The routing policy and what it knows now (kv: its index and the measured speeds)."""
    return web.json_response(request.app[STATE].routing_facts())


async def instances_list(request: web.Request) -> web.Response:
    """Every instance with its state."""
    return web.json_response({"instances": _describe(request.app[STATE].pool.all())})


def _describe(insts: list[Instance]) -> list[dict[str, object]]:
    return [
        {
            "url": i.url,
            "role": i.role,
            "healthy": i.healthy,
            "draining": i.draining,
            "stalled": i.stalled,
            "requests_in_flight": i.requests,
            "requests_streaming": i.streaming,
            "tokens_in_flight": i.tokens,
            "tokens_waiting": i.waiting,
        }
        for i in insts
    ]


def run(config: ProxyConfig) -> None:
    """Run the proxy until SIGINT/SIGTERM; a port that cannot be bound is a one-line error."""
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:  # uvloop makes relaying each chunk markedly cheaper; plain asyncio works the same, slower
        import uvloop

        loop: asyncio.AbstractEventLoop = uvloop.new_event_loop()
    except ImportError:
        loop = asyncio.new_event_loop()
    if config.mode == "pd":
        sides = f"{len(config.prefillers)} prefill, {len(config.decoders)} decode"
    else:
        sides = f"{len(config.instances)} mixed"
    mode = config.mode + (f" p2p {config.p2p}" if config.p2p else "") + f", routing {config.routing}"
    key = ", API key on" if config.api_key else ""

    def announce(_: str) -> None:
        where = f"http://{config.host}:{config.port}"
        print(f"ucmctl proxy: {mode} mode on {where} ({sides} instances{key})", file=sys.stderr, flush=True)

    try:
        web.run_app(
            make_app(config),
            host=config.host,
            port=config.port,
            loop=loop,
            handler_cancellation=True,
            access_log=None,
            print=announce,
            shutdown_timeout=5.0,
        )
    except OSError as exc:
        raise UcmctlError.one(
            f"cannot listen on {config.host}:{config.port}: {exc.strerror or exc}",
            status=ExitStatus.FAILURE,
            fix="pick a free port with --port",
        ) from None
