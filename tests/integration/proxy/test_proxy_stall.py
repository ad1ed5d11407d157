"""A server that stops sending tokens without dying (#48): SIGSTOP stands in for an engine hung on
its device or a node cut off without a reset (its sockets stay open and nothing comes, so no read
fails). The proxy's stall watch takes it out of routing and moves its answers on; let go again
(SIGCONT), it comes back into routing once it answers a one-token completion."""

from __future__ import annotations

import asyncio
import signal
import time
from pathlib import Path

import pytest

from tests.integration.sim.test_sim_server import shared_store

from .procs import metric, pd_flags, proxy, sim, wait_for
from .test_proxy_migration import STEP_MS, Launch, _check_same, _requests, _run, _sixty_tokens_in

STALL_S = 2.0


@pytest.mark.slow
def test_a_hung_instance_costs_no_answer_and_comes_back(launch: Launch, tmp_path: Path) -> None:
    """1P2D, 8 streams of 300 tokens (4.5 s each), decode-0 stopped after ~60 tokens of its
    streams: every answer comes whole and equal to the same request answered without the fault,
    the streams it had moved on (cause: stall) within the stall timeout and a continuation, not
    the read timeout; it is out of routing while stopped, and back once let go."""
    _, flags = shared_store(tmp_path)
    gen = [*flags, "--decode-step-ms", STEP_MS]
    ref = sim(tmp_path)  # the reference: the same requests on an instance of its own, no fault
    p, a, b = sim(tmp_path, *flags), sim(tmp_path, *gen), sim(tmp_path, *gen)
    watch = ["--health-interval", "0.5", "--stall-timeout", f"{STALL_S:g}"]
    px = proxy(tmp_path, *pd_flags([p], [a, b]), *watch)
    launch(ref, p, a, b, px)
    reqs = _requests(8)
    want = asyncio.run(_run(ref.url, reqs))
    on_victim: list[float] = []

    async def hang_a() -> None:
        on_victim.append(await _sixty_tokens_in(a.url))
        a.send(signal.SIGSTOP)

    started = time.monotonic()
    got = asyncio.run(_run(px.url, reqs, hang_a))
    took = time.monotonic() - started
    _check_same(got, want, reqs)
    moved = metric(px.url, "ucmctl_proxy_migrations_total", absent=0, outcome="resumed", cause="stall")
    assert on_victim[0] >= 2 and moved == on_victim[0], (on_victim, moved)
    assert metric(px.url, "ucmctl_proxy_migrations_total", absent=0, outcome="not_continued") == 0
    assert metric(px.url, "ucmctl_proxy_errors_total", reason="upstream_mid_stream") == moved  # failures
    assert metric(px.url, "ucmctl_proxy_instance_stalls_total", instance=a.url) == 1
    assert metric(px.url, "ucmctl_proxy_instance_stalled", instance=a.url) == 1
    assert metric(px.url, "ucmctl_proxy_instance_stalled", instance=b.url) == 0
    # 300 tokens of 15 ms, a stall of 2 s, a continuation: far below the 600 s read timeout
    assert took < 30, took
    # each continuation loaded its context from the store: at least 3 full blocks of each
    assert metric(b.url, "vllm:external_prefix_cache_hits_total") >= moved * 3 * 16
    wait_for(lambda: metric(px.url, "ucmctl_proxy_instance_requests_in_flight") == 0, 5, "counts settle")

    a.send(signal.SIGCONT)

    def back() -> bool:
        """In routing again: its probe answered (not stalled), and its health answers again (the
        health loop took it out too while it was stopped)."""
        stalled = metric(px.url, "ucmctl_proxy_instance_stalled", instance=a.url)
        return stalled == 0 and metric(px.url, "ucmctl_proxy_instance_healthy", instance=a.url) == 1

    wait_for(back, 15, "a back in routing")
    sent = metric(px.url, "ucmctl_proxy_instance_requests_total", instance=a.url)
    asyncio.run(_run(px.url, _requests(4)))
    assert metric(px.url, "ucmctl_proxy_instance_requests_total", instance=a.url) > sent  # routed to again


@pytest.mark.slow
def test_requests_waiting_on_an_instance_hung_while_idle_go_elsewhere(launch: Launch, tmp_path: Path) -> None:
    """Two mixed instances; one stopped while it streams nothing, then 6 requests: those the
    proxy sends it wait for an answer that never comes, until the stall watch (nothing from it
    for 2 s, then no answer to a one-token probe for 2 s either) sends them to the other. Every
    request is answered whole, in seconds, not after the read timeout."""
    a, b = sim(tmp_path, "--decode-step-ms", "5"), sim(tmp_path, "--decode-step-ms", "5")
    mixed = ["--mode", "mixed", "--instance", a.url, "--instance", b.url, "--routing", "round-robin"]
    px = proxy(tmp_path, *mixed, "--health-interval", "60", "--stall-timeout", f"{STALL_S:g}")
    launch(a, b, px)
    a.send(signal.SIGSTOP)
    reqs = [(path, {**body, "max_tokens": 20}) for path, body in _requests(6)]
    started = time.monotonic()
    got = asyncio.run(_run(px.url, reqs))
    took = time.monotonic() - started
    for (status, raw), (_, body) in zip(got, reqs, strict=True):
        assert status == 200 and (not body["stream"] or raw.endswith(b"data: [DONE]\n\n")), raw[-300:]
    assert took < 15, took  # 2 s of silence, 2 s of probe, then b: not the 600 s read timeout
    assert metric(px.url, "ucmctl_proxy_instance_stalls_total", instance=a.url) == 1
    # every request sent to a went to b once a was found: b answered all six
    sent_a = metric(px.url, "ucmctl_proxy_instance_requests_total", instance=a.url)
    assert sent_a >= 1 and metric(px.url, "ucmctl_proxy_retries_total", leg="mixed") == sent_a
    assert metric(px.url, "ucmctl_proxy_instance_requests_total", instance=b.url) == 6
    a.send(signal.SIGCONT)


@pytest.mark.slow
def test_a_pause_of_the_proxy_itself_is_no_instances_stall(launch: Launch, tmp_path: Path) -> None:
    """The proxy stopped for 2.5 s (a paused VM, a starved host) while two instances stream: the
    silence it did not hear is not theirs; nothing is cut, every answer ends whole."""
    a, b = sim(tmp_path, "--decode-step-ms", STEP_MS), sim(tmp_path, "--decode-step-ms", STEP_MS)
    mixed = ["--mode", "mixed", "--instance", a.url, "--instance", b.url]
    px = proxy(tmp_path, *mixed, "--health-interval", "60", "--stall-timeout", f"{STALL_S:g}")
    launch(a, b, px)
    reqs = [(path, body) for path, body in _requests(4) if body["stream"]]

    async def pause_proxy() -> None:
        await asyncio.sleep(1.0)
        px.send(signal.SIGSTOP)
        await asyncio.sleep(2.5)
        px.send(signal.SIGCONT)

    got = asyncio.run(_run(px.url, reqs, pause_proxy))
    for status, raw in got:
        assert status == 200 and raw.endswith(b"data: [DONE]\n\n") and b'"error"' not in raw, raw[-300:]
    for inst in (a, b):
        assert metric(px.url, "ucmctl_proxy_instance_stalls_total", instance=inst.url) == 0
    assert metric(px.url, "ucmctl_proxy_migrations_total", absent=0) == 0
