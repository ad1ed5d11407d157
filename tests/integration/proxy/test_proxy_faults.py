"""Faults and timing with real processes: killed instances, disconnects, all down, API key, chunk gaps."""

from __future__ import annotations

import asyncio
import itertools
import json
import statistics
import time
from collections.abc import Callable
from typing import Any

import aiohttp
import pytest

from .procs import (
    HOST,
    Proc,
    completion,
    free_port,
    get,
    metric,
    pd_flags,
    post,
    proxy,
    sim,
    sse_events,
    wait_for,
)

Launch = Callable[..., list[Proc]]


@pytest.mark.slow
def test_killed_instances_are_routed_around(launch: Launch, tmp_path) -> None:  # type: ignore[no-untyped-def]
    p1, p2, d1, d2 = sim(tmp_path), sim(tmp_path), sim(tmp_path), sim(tmp_path)
    # health checks far apart: the request path alone must route around the dead instances
    px = proxy(tmp_path, *pd_flags([p1, p2], [d1, d2]), "--health-interval", "60")
    launch(p1, p2, d1, d2, px)
    for _ in range(6):  # warm: every instance now has a pooled keep-alive connection from the proxy
        assert post(px.url + "/v1/completions", completion(4))[0] == 200
    p1.kill()
    d1.kill()
    # right away, before any health check could notice: retries carry these to the live instances
    results = [post(px.url + "/v1/completions", completion(4, stream=i % 2 == 0)) for i in range(10)]
    assert [s for s, _, _ in results] == [200] * 10
    for _, _, raw in results:
        body = raw.decode()
        assert body.endswith("data: [DONE]\n\n") or json.loads(body)["usage"]["completion_tokens"] == 4
    assert metric(px.url, "ucmctl_proxy_instance_healthy", instance=p1.url) == 0
    assert metric(px.url, "ucmctl_proxy_instance_healthy", instance=d1.url) == 0
    assert metric(px.url, "ucmctl_proxy_retries_total", leg="prefill") >= 1
    assert metric(px.url, "ucmctl_proxy_retries_total", leg="decode") >= 1
    status, _, raw = get(px.url + "/health")
    assert status == 200 and json.loads(raw)["healthy"] == {"prefill": 1, "decode": 1}


@pytest.mark.slow
def test_instance_back_after_restart_and_all_down_is_503(launch: Launch, tmp_path) -> None:  # type: ignore[no-untyped-def]
    p1, d1 = sim(tmp_path), sim(tmp_path)
    px = proxy(tmp_path, *pd_flags([p1], [d1]))
    launch(p1, d1, px)
    d1.kill()
    t0 = time.perf_counter()
    status, _, raw = post(px.url + "/v1/completions", completion(4))
    assert status == 503 and "decode" in json.loads(raw)["error"]["message"]
    t0 = time.perf_counter()
    status, _, raw = post(px.url + "/v1/completions", completion(4))  # now known down: no attempt at all
    assert status == 503 and time.perf_counter() - t0 < 0.5
    assert json.loads(raw)["error"]["message"] == "no healthy decode instance"
    assert get(px.url + "/health")[0] == 503
    d1.popen = None
    launch(d1)  # the same port again: the health check brings it back
    wait_for(lambda: get(px.url + "/health")[0] == 200, 5, "decode instance back in routing")
    assert post(px.url + "/v1/completions", completion(4))[0] == 200


def test_nothing_listening_gives_503_at_once(launch: Launch, tmp_path) -> None:  # type: ignore[no-untyped-def]
    dead = [f"http://{HOST}:{free_port()}" for _ in range(2)]
    px = proxy(tmp_path, "--mode", "pd", "--prefiller", dead[0], "--decoder", dead[1])
    launch(px, proxies_ready="/metrics")
    for _ in range(3):
        t0 = time.perf_counter()
        status, _, raw = post(px.url + "/v1/completions", completion(4, stream=True))
        assert status == 503 and time.perf_counter() - t0 < 0.5
        assert "prefill" in json.loads(raw)["error"]["message"]
    assert get(px.url + "/health")[0] == 503
    assert get(px.url + "/v1/models")[0] == 503


async def _running(url: str) -> float:
    return await asyncio.to_thread(metric, url, "vllm:num_requests_running")


@pytest.mark.slow
def test_client_disconnect_frees_both_legs(launch: Launch, tmp_path) -> None:  # type: ignore[no-untyped-def]
    # decode: 20 ms a token, so 500 tokens take 10 s; prefill: 2 ms a prompt token, 1000 tokens take 2 s
    p1 = sim(tmp_path, "--prefill-us-per-token", "2000")
    d1 = sim(tmp_path, "--decode-step-ms", "20")
    px = proxy(tmp_path, *pd_flags([p1], [d1]))
    launch(p1, d1, px)

    async def disconnect_mid_stream() -> None:
        async with aiohttp.ClientSession() as s:
            r = await s.post(px.url + "/v1/completions", json=completion(500, stream=True, prompt=[5, 6, 7]))
            assert r.status == 200
            for _ in range(3):
                assert await r.content.readany()
            assert await _running(d1.url) == 1
            r.close()  # drop the connection mid-stream

    async def disconnect_during_prefill() -> None:
        async with aiohttp.ClientSession() as s:
            task = asyncio.create_task(
                s.post(px.url + "/v1/completions", json=completion(5, prompt=[9] * 1000))
            )
            await asyncio.sleep(0.5)
            assert await _running(p1.url) == 1
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task

    asyncio.run(disconnect_mid_stream())
    wait_for(lambda: metric(d1.url, "vllm:num_requests_running") == 0, 2, "decode sim freed after disconnect")
    decoded = metric(d1.url, "vllm:generation_tokens_total")
    assert decoded < 100  # it stopped, not ran to 500
    asyncio.run(disconnect_during_prefill())
    wait_for(
        lambda: metric(p1.url, "vllm:num_requests_running") == 0, 2, "prefill sim freed after disconnect"
    )
    time.sleep(0.3)
    assert metric(d1.url, "vllm:generation_tokens_total") == decoded  # no decode leg was started
    wait_for(
        lambda: metric(px.url, "ucmctl_proxy_instance_requests_in_flight") == 0, 2, "proxy counts settle"
    )


@pytest.mark.slow
def test_killed_decoder_mid_stream_breaks_the_answer_visibly(launch: Launch, tmp_path) -> None:  # type: ignore[no-untyped-def]
    p1, d1, d2 = (
        sim(tmp_path),
        sim(tmp_path, "--decode-step-ms", "20"),
        sim(tmp_path, "--decode-step-ms", "20"),
    )
    # without migrations (--migrations 0): the cut answer is not continued elsewhere
    px = proxy(tmp_path, *pd_flags([p1], [d1, d2]), "--health-interval", "60", "--migrations", "0")
    launch(p1, d1, d2, px)
    got: list[bytes] = []
    roles: dict[str, Proc] = {}

    async def go() -> None:
        async with aiohttp.ClientSession() as s:
            # two answers at once: least-loaded routing puts them on different decoders
            body = completion(500, stream=True)
            r = await s.post(px.url + "/v1/completions", json=body)
            other = await s.post(px.url + "/v1/completions", json=completion(3, stream=True))
            assert (await other.read()).endswith(b"data: [DONE]\n\n")
            got.append(await r.content.readany())
            roles["victim"], roles["other"] = (d1, d2) if await _running(d1.url) == 1 else (d2, d1)
            assert await _running(roles["other"].url) == 0
            roles["victim"].kill()
            with pytest.raises(aiohttp.ClientPayloadError):  # not a clean end that looks complete
                while chunk := await r.content.readany():
                    got.append(chunk)

    asyncio.run(go())
    events = sse_events(b"".join(got))
    # tokens came, then one error event the client's SSE parser reads; never a [DONE], and the
    # answer that had streamed tokens is not sent again elsewhere
    assert len(events) >= 2 and "[DONE]" not in events
    error = json.loads(events[-1])["error"]
    assert error["code"] == 502 and roles["victim"].url in error["message"]
    assert "incomplete" in error["message"]
    assert all("choices" in json.loads(e) for e in events[:-1] if e.strip())
    assert metric(px.url, "ucmctl_proxy_errors_total", reason="upstream_mid_stream") == 1
    assert metric(px.url, "ucmctl_proxy_first_token_retries_total", absent=0, leg="decode") == 0
    assert metric(roles["other"].url, "vllm:request_success_total") == 1  # only the short answer


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["pd", "mixed"])
def test_decoder_killed_before_its_first_token_is_retried(launch: Launch, tmp_path, mode: str) -> None:  # type: ignore[no-untyped-def]
    # a 1000-token prompt takes the slow servers 4 s before their first token
    slow = ("--prefill-us-per-token", "4000")
    p1 = sim(tmp_path)
    d1, d2 = sim(tmp_path, *slow), sim(tmp_path, *slow)
    flags = pd_flags([p1], [d1, d2]) if mode == "pd" else ["--mode", "mixed", "--instance", d1.url,
                                                           "--instance", d2.url]  # fmt: skip
    px = proxy(tmp_path, *flags, "--health-interval", "60")
    launch(*([p1] if mode == "pd" else []), d1, d2, px)

    body = {**completion(5, stream=True, prompt=[7] * 1000), "stream_options": {"include_usage": True}}

    async def go() -> tuple[int, bytes]:
        async with aiohttp.ClientSession() as s:
            task = asyncio.create_task(s.post(px.url + "/v1/completions", json=body))
            await wait_async(lambda: _running_any(d1, d2), 5)
            victim = d1 if await _running(d1.url) == 1 else d2
            victim.kill()
            r = await task
            return r.status, await r.read()

    status, raw = asyncio.run(go())
    # the client saw one whole answer, from the instance that stayed
    assert status == 200 and raw.endswith(b"data: [DONE]\n\n")
    events = [json.loads(e) for e in sse_events(raw) if e != "[DONE]"]
    assert sum(1 for e in events if e.get("choices")) == 5
    assert events[-1]["usage"]["prompt_tokens"] == 1000
    leg = "decode" if mode == "pd" else "mixed"
    assert metric(px.url, "ucmctl_proxy_first_token_retries_total", leg=leg) == 1
    assert metric(px.url, "ucmctl_proxy_errors_total", absent=0, reason="upstream") == 0


async def _running_any(*sims: Proc) -> bool:
    return any([await _running(p.url) == 1 for p in sims])


async def wait_async(predicate: Callable[[], Any], timeout: float) -> None:
    deadline = time.perf_counter() + timeout
    while not await predicate():
        assert time.perf_counter() < deadline, "no instance took the request"
        await asyncio.sleep(0.05)


async def _gaps(url: str, tokens: int) -> list[float]:
    """Inter-arrival times of a stream's SSE events as the client sees them."""
    arrivals: list[float] = []
    async with aiohttp.ClientSession() as s:
        body = completion(tokens, stream=True, prompt=[11, 12, 13])
        async with s.post(url + "/v1/completions", json=body) as r:
            while chunk := await r.content.readany():
                now = time.perf_counter()
                arrivals += [now] * chunk.count(b"data: ")
    return [b - a for a, b in itertools.pairwise(arrivals[:-1])]  # token to token; [DONE] is no token


@pytest.mark.slow
def test_chunk_timing_is_preserved(launch: Launch, tmp_path) -> None:  # type: ignore[no-untyped-def]
    step = 0.020
    p1, d1 = sim(tmp_path), sim(tmp_path, "--decode-step-ms", str(step * 1000))
    px = proxy(tmp_path, *pd_flags([p1], [d1]))
    launch(p1, d1, px)
    direct = asyncio.run(_gaps(d1.url, 40))
    proxied = asyncio.run(_gaps(px.url, 40))
    assert len(direct) == len(proxied) == 39
    med_direct, med_proxied = statistics.median(direct), statistics.median(proxied)
    assert abs(med_direct - step) < 0.004
    assert abs(med_proxied - med_direct) < 0.003, (med_direct, med_proxied)
    # no batching: events come one by one, not bunched into a few big reads
    assert sum(1 for g in proxied if g < step / 4) <= 4


def test_api_key(launch: Launch, tmp_path) -> None:  # type: ignore[no-untyped-def]
    m1 = sim(tmp_path)
    px = proxy(tmp_path, "--mode", "mixed", "--instance", m1.url, env={"UCMCTL_PROXY_API_KEY": "s3cret"})
    launch(m1, px)
    assert "s3cret" not in " ".join(px.argv)
    url = px.url + "/v1/completions"
    assert post(url, completion(2))[0] == 401
    assert post(url, completion(2), headers={"Authorization": "Bearer wrong"})[0] == 401
    assert post(url, completion(2), headers={"Authorization": "Bearer s3cret"})[0] == 200
    assert post(px.url + "/instances/remove", {"url": m1.url})[0] == 401
    assert get(px.url + "/health")[0] == 200  # probes and scrapers need no key
    assert get(px.url + "/metrics")[0] == 200
    assert metric(px.url, "ucmctl_proxy_errors_total", reason="unauthorized") == 3


def test_mixed_mode_spreads_and_streams(launch: Launch, tmp_path) -> None:  # type: ignore[no-untyped-def]
    m1, m2 = sim(tmp_path), sim(tmp_path)
    flags = ["--instance", m1.url, "--instance", m2.url, "--routing", "affinity"]
    px = proxy(tmp_path, "--mode", "mixed", *flags)
    launch(m1, m2, px)
    assert post(px.url + "/v1/completions", completion(2))[0] == 200  # no API key: open by default
    for i in range(8):  # distinct prompts go by load (ties round-robin)
        status, _, raw = post(px.url + "/v1/completions", completion(3, True, [200 + i] * 200))
        assert status == 200 and len(sse_events(raw)) == 4
    counts = [metric(m.url, "vllm:request_success_total") for m in (m1, m2)]
    assert sorted(counts) == [4, 5] or counts == [4.5, 4.5], counts
    before = [metric(m.url, "vllm:request_success_total") for m in (m1, m2)]
    shared = list(range(1, 300))
    for i in range(6):  # the same leading block: one instance, every time
        assert post(px.url + "/v1/completions", completion(2, prompt=[*shared, i]))[0] == 200
    after = [metric(m.url, "vllm:request_success_total") for m in (m1, m2)]
    assert sorted(a - b for a, b in zip(after, before, strict=True)) == [0, 6]
