"""Answers that go on when their instance dies mid-stream (#48): simulators sharing a UCM store
behind a real proxy, a decode (or mixed) instance killed with SIGKILL while it streams, every
client's answer compared with the same request answered without the fault."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.integration.sim.test_sim_server import shared_store

from .procs import Proc, metric, pd_flags, proxy, sim, sse_events, wait_for
from .test_proxy_mooncake import CONSUMER, mooncake_pair, transferred

Launch = Callable[..., list[Proc]]
STEP_MS = "15"  # a decode step: 300 tokens take 4.5 s
TOKENS = 300
WHOLE = (5, 6)  # the requests for a whole answer: a chat with ids, a completion (next to each other)


def _prompt(i: int) -> list[int]:
    return [(n * 7 + i * 131) % 800 + 3 for n in range(90 + 17 * i)]


def _requests(n: int) -> list[tuple[str, dict[str, Any]]]:
    """`n` requests: completions and chats, some asking for the token ids and usage, two for the
    answer whole (not streamed)."""
    out: list[tuple[str, dict[str, Any]]] = []
    for i in range(n):
        body: dict[str, Any] = {
            "model": "sim-model",
            "max_tokens": TOKENS,
            "stream": i not in WHOLE,
            "ignore_eos": True,
        }
        if i % 3 == 2:
            body["messages"] = [{"role": "user", "content": f"conversation {i}: " + "tell me more " * 20}]
            path = "/v1/chat/completions"
        else:
            body["prompt"] = _prompt(i)
            path = "/v1/completions"
        if i % 2 and body["stream"]:
            body["stream_options"] = {"include_usage": True}
        if i % 4 == 1:
            body["return_token_ids"] = True
        body["user"] = f"r{i}"  # its request id too
        out.append((path, body))
    return out


def _text(chunks: list[dict[str, Any]]) -> str:
    return "".join(
        c["choices"][0]["delta"].get("content", "") if "delta" in c["choices"][0] else c["choices"][0]["text"]
        for c in chunks
        if c.get("choices")
    )


async def _stream(s: aiohttp.ClientSession, url: str, path: str, body: dict[str, Any]) -> tuple[int, bytes]:
    async with s.post(url + path, json=body, headers={"X-Request-Id": body.get("user", "")}) as r:
        return r.status, await r.read()


async def _run(
    url: str, reqs: list[tuple[str, dict[str, Any]]], during: Any = None
) -> list[tuple[int, bytes]]:
    timeout = aiohttp.ClientTimeout(total=120)
    async with aiohttp.ClientSession(timeout=timeout) as s:
        tasks = []
        for path, body in reqs:
            tasks.append(asyncio.create_task(_stream(s, url, path, body)))
            if during is not None:  # their legs reach the instances in order, taken in turn: the
                await asyncio.sleep(0.05)  # whole answers (next to each other) on both (P2P's
                # prefill legs, sent at once, came back out of order once: neither on the victim)
        if during is not None:
            await during()
        return await asyncio.gather(*tasks)


def _check_same(got: list[tuple[int, bytes]], want: list[tuple[int, bytes]], reqs: list[Any]) -> None:
    """Each answer is the one its request gets without the fault: the same text, the same ids
    where asked (and none where not), one id, one finish, usage of the whole answer."""
    for (status, raw), (_, ref), (_, body) in zip(got, want, reqs, strict=True):
        if not body["stream"]:
            assert status == 200, raw[-300:]
            _check_same_whole(json.loads(raw), json.loads(ref), body)
            continue
        assert status == 200 and raw.endswith(b"data: [DONE]\n\n"), raw[-300:]
        events = [json.loads(e) for e in sse_events(raw) if e != "[DONE]"]
        refs = [json.loads(e) for e in sse_events(ref) if e != "[DONE]"]
        assert not any("error" in e for e in events), events
        assert _text(events) == _text(refs) and len(_text(events)) > TOKENS // 2
        assert len({e["id"] for e in events}) == 1 and len({e["created"] for e in events}) == 1
        finishes = [c["finish_reason"] for e in events for c in e["choices"] if c.get("finish_reason")]
        assert finishes == ["length"]
        ids = [t for e in events for c in e["choices"] for t in c.get("token_ids") or ()]
        if body.get("return_token_ids"):
            assert ids == [t for e in refs for c in e["choices"] for t in c.get("token_ids") or ()]
            assert len(ids) == TOKENS
        else:
            assert ids == [] and b"token_ids" not in raw  # only what the client asked for
        usage = [e["usage"] for e in events if e.get("usage")]
        if body.get("stream_options"):
            ref_usage = next(e["usage"] for e in refs if e.get("usage"))
            assert len(usage) == 1 and usage[0]["completion_tokens"] == TOKENS
            assert usage[0]["prompt_tokens"] == ref_usage["prompt_tokens"]
            assert usage[0]["total_tokens"] == ref_usage["prompt_tokens"] + TOKENS
        else:
            assert usage == []


def _check_same_whole(got: dict[str, Any], ref: dict[str, Any], body: dict[str, Any]) -> None:
    """A whole answer is the one its request gets without the fault (assembled by the proxy from
    the legs it streamed): the same text, the ids where asked, usage of the whole answer."""
    (c,), (rc,) = got["choices"], ref["choices"]
    text, ref_text = (
        (c["message"]["content"], rc["message"]["content"]) if "messages" in body else (c["text"], rc["text"])
    )
    assert text == ref_text and len(text) > TOKENS // 2
    assert c["finish_reason"] == "length" and got["object"] == ref["object"]
    if body.get("return_token_ids"):
        assert c["token_ids"] == rc["token_ids"] and len(c["token_ids"]) == TOKENS
    else:
        assert c.get("token_ids") is None
    assert got["usage"]["completion_tokens"] == TOKENS
    assert got["usage"]["prompt_tokens"] == ref["usage"]["prompt_tokens"]


async def _running(url: str) -> float:
    async with aiohttp.ClientSession() as s, s.get(url + "/metrics") as r:
        text = await r.text()
    return sum(
        float(line.split()[-1]) for line in text.splitlines() if line.startswith("vllm:num_requests_running")
    )


async def _sixty_tokens_in(url: str) -> float:
    """Once the instance at `url` streams two answers or more (on a loaded machine the prefill
    legs may take longer than 60 steps), ~60 tokens of each later: how many it streams then."""
    deadline = asyncio.get_running_loop().time() + 20
    while await _running(url) < 2 and asyncio.get_running_loop().time() < deadline:
        await asyncio.sleep(0.05)
    await asyncio.sleep(int(STEP_MS) * 60 / 1000)
    return await _running(url)


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["pd", "mixed", "p2p"])
def test_a_killed_instance_costs_no_answer(launch: Launch, tmp_path: Path, mode: str) -> None:
    """1P2D (and two mixed instances, and 1P2D with Mooncake's P2P transfer): 8 streams of 300
    tokens, one instance killed with SIGKILL after ~60 tokens of its streams: every answer comes
    whole and equal to the same request answered without the fault; the streams it had moved
    (counted), and their continuations loaded the prompt and the tokens so far from the store
    (P2P: the prefill leg ran again for the longer prompt and its KV came over)."""
    _, flags = shared_store(tmp_path)
    gen = [*flags, "--decode-step-ms", STEP_MS]
    ref = sim(tmp_path)  # the reference: the same requests on an instance of its own, no fault
    if mode == "pd":
        p, a, b = sim(tmp_path, *flags), sim(tmp_path, *gen), sim(tmp_path, *gen)
        px = proxy(tmp_path, *pd_flags([p], [a, b]), "--health-interval", "60")
        launch(ref, p, a, b, px)
    elif mode == "p2p":
        p, a, _ = mooncake_pair(tmp_path)
        b = sim(tmp_path, "--kv-transfer-config", CONSUMER)
        for d in (a, b):
            d.argv += ["--decode-step-ms", STEP_MS]
        boot = f"http://127.0.0.1:{p.env['VLLM_MOONCAKE_BOOTSTRAP_PORT']}"  # type: ignore[index]
        px = proxy(tmp_path, *pd_flags([p], [a, b]), "--p2p", "mooncake", "--bootstrap", boot,
                   "--health-interval", "60")  # fmt: skip
        launch(ref, p, a, b, px)
    else:
        a, b = sim(tmp_path, *gen), sim(tmp_path, *gen)
        mixed = ["--mode", "mixed", "--instance", a.url, "--instance", b.url]
        px = proxy(tmp_path, *mixed, "--health-interval", "60")
        launch(ref, a, b, px)
    reqs = _requests(8)
    want = asyncio.run(_run(ref.url, reqs))
    on_victim: list[float] = []

    async def kill_a() -> None:
        on_victim.append(await _sixty_tokens_in(a.url))
        a.kill()

    got = asyncio.run(_run(px.url, reqs, kill_a))
    _check_same(got, want, reqs)
    moved = metric(px.url, "ucmctl_proxy_migrations_total", outcome="resumed")
    assert on_victim[0] >= 2 and moved == on_victim[0], (on_victim, moved)
    assert metric(px.url, "ucmctl_proxy_migrations_total", absent=0, outcome="not_continued") == 0
    assert metric(px.url, "ucmctl_proxy_migration_gap_seconds_count") == moved
    went_on = {
        line.split("answer ")[1].split()[0]
        for line in px.log.read_text().splitlines()
        if " goes on on " in line
    }
    assert any(f"r{i}" in went_on for i in WHOLE), went_on  # a whole answer moved too
    if mode == "p2p":  # each continuation's prompt (90 tokens and more) came over from the prefiller
        assert transferred(b) >= moved * 90
    else:  # each continuation loaded its context from the store: at least 3 full blocks of each
        assert metric(b.url, "vllm:external_prefix_cache_hits_total") >= moved * 3 * 16
    wait_for(lambda: metric(px.url, "ucmctl_proxy_instance_requests_in_flight") == 0, 5, "counts settle")


async def _until_cut(s: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> bytes:
    """What a stream brought before it broke (a stream that ends cleanly fails the test)."""
    got = b""
    async with s.post(url + "/v1/completions", json=body) as r:
        with pytest.raises(aiohttp.ClientPayloadError):
            while chunk := await r.content.readany():
                got += chunk
    return got


@pytest.mark.slow
def test_an_answer_that_cannot_go_on_faithfully_ends_with_why(launch: Launch, tmp_path: Path) -> None:
    """Two answers at once (n = 2), and an answer through a proxy with --migrations 0: cut
    mid-stream, each ends with an error event that says why it was not continued, nothing of it
    is sent again, and no request is left running."""
    _, flags = shared_store(tmp_path)
    gen = [*flags, "--decode-step-ms", STEP_MS]
    p, a, b = sim(tmp_path, *flags), sim(tmp_path, *gen), sim(tmp_path, *gen)
    px = proxy(tmp_path, *pd_flags([p], [a, b]), "--health-interval", "60")
    off = proxy(tmp_path, *pd_flags([p], [a, b]), "--health-interval", "60", "--migrations", "0")
    launch(p, a, b, px, off)
    body = {
        "model": "sim-model",
        "prompt": _prompt(1),
        "max_tokens": TOKENS,
        "stream": True,
        "ignore_eos": True,
    }

    async def go() -> list[bytes]:
        async with aiohttp.ClientSession() as s:
            cut = [_until_cut(s, px.url, {**body, "n": 2}), _until_cut(s, off.url, body)]
            tasks = [asyncio.create_task(c) for c in cut]
            await asyncio.sleep(0.6)
            assert await _running(a.url) + await _running(b.url) == 3
            a.kill()
            b.kill()
            return await asyncio.gather(*tasks)

    for raw, url, why in zip(
        asyncio.run(go()), (px.url, off.url), ("n > 1", "migrations are off"), strict=True
    ):
        events = sse_events(raw)
        error = json.loads(events[-1])["error"]
        assert error["code"] == 502 and f"not continued: {why}" in error["message"], error
        assert all("choices" in json.loads(e) for e in events[:-1])
        assert metric(url, "ucmctl_proxy_migrations_total", outcome="not_continued") == 1
        assert metric(url, "ucmctl_proxy_migrations_total", absent=0, outcome="resumed") == 0


@pytest.mark.slow
def test_a_client_gone_during_a_migration_leaves_no_request_running(launch: Launch, tmp_path: Path) -> None:
    """The client closes its connection right after its instance was killed, while the proxy
    brings its answer to another (whose first token takes 0.4 s or more: a slow prefill of the
    tokens the store lacks): the continuation is stopped at once, no instance keeps generating it (300
    tokens would take 4.5 s), and the proxy's counts come back to nothing in flight."""
    _, flags = shared_store(tmp_path)
    gen = [*flags, "--decode-step-ms", STEP_MS]
    p, a = sim(tmp_path, *flags), sim(tmp_path, *gen)
    b = sim(tmp_path, *gen, "--prefill-us-per-token", "100000")
    px = proxy(tmp_path, *pd_flags([p], [a]), "--health-interval", "60")
    launch(p, a, b, px)
    body = {"model": "sim-model", "prompt": _prompt(2), "max_tokens": TOKENS, "stream": True,
            "ignore_eos": True}  # fmt: skip

    async def go() -> None:
        async with aiohttp.ClientSession() as s:
            r = await s.post(px.url + "/v1/completions", json=body)
            got = b""
            while got.count(b"data:") < 40:
                got += await r.content.readany()
            # b joins now: the only other decode instance, where the answer must go on
            add = await s.post(px.url + "/instances/add", json={"url": b.url, "role": "decode"})
            assert (await add.json())["healthy"] is True
            a.kill()
            await asyncio.sleep(0.1)
            r.close()  # the client is gone, mid-migration

    asyncio.run(go())
    wait_for(lambda: metric(px.url, "ucmctl_proxy_errors_total", absent=0, reason="client_disconnect") == 1,
             5, "the proxy saw the client go")  # fmt: skip
    # the continuation was on its way to b (b took it up) and went with the client
    assert metric(px.url, "ucmctl_proxy_migrations_total", absent=0, outcome="cancelled") == 1
    assert metric(px.url, "ucmctl_proxy_migrations_total", absent=0, outcome="resumed") == 0
    wait_for(lambda: metric(b.url, "vllm:prompt_tokens_total", absent=0) > 0, 1, "b saw the continuation")
    # stopped on b at once, not 4.5 s of tokens later
    wait_for(lambda: asyncio.run(_running(b.url)) == 0, 1.5, "the continuation stopped on b")
    assert asyncio.run(_running(p.url)) == 0
    wait_for(lambda: metric(px.url, "ucmctl_proxy_instance_requests_in_flight") == 0, 5, "counts settle")
