"""`bench --fault`: the spec as users type it, and the figures of what the fault cost."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from ucmctl.bench.client import RequestResult
from ucmctl.bench.fault import (
    ALL,
    Fault,
    FaultSpec,
    cost_at_proxy,
    fault_lines,
    parse_fault,
    proxy_samples,
    resume_gaps,
    window_figures,
)
from ucmctl.core.errors import UcmctlError


@pytest.mark.parametrize(
    ("text", "spec"),
    [
        ("kill:decode-0@30s", FaultSpec("kill", "decode-0", 30.0)),
        ("stop:prefill-1@2m", FaultSpec("stop", "prefill-1", 120.0)),
        (" kill:proxy@12.5 ", FaultSpec("kill", "proxy", 12.5)),
        ("hang:decode-1@6s", FaultSpec("hang", "decode-1", 6.0)),
    ],
)
def test_specs_as_users_type_them(text: str, spec: FaultSpec) -> None:
    assert parse_fault(text) == spec


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("kill:decode-0", "is not a fault"),
        ("kill:decode 0@3s", "is not a fault"),
        ("kill:$(id)@3s", "is not a fault"),
        ("freeze:decode-0@3s", "'freeze' is not an action"),
        ("kill:decode-0@0s", "the time must be after the phase's start"),
        ("kill:decode-0@-3s", "is not a fault"),
        ("kill:decode-0@3h", "is not a fault"),
    ],
)
def test_bad_specs_are_one_line_naming_the_option(text: str, said: str) -> None:
    with pytest.raises(UcmctlError) as caught:
        parse_fault(text)
    assert said in str(caught.value) and "--fault" in str(caught.value)


def _result(start: float, ok: bool, ttft: float = 0.1, latency: float = 1.0) -> RequestResult:
    r = RequestResult(0, 8, ok=ok, ttft=ttft, latency=latency, start_time=start)
    return r


def test_window_figures_count_what_was_sent_in_it() -> None:
    results = [_result(9.0, True, 0.010, 1.0), _result(10.0, False), _result(10.5, True, 0.030, 3.0),
               _result(11.0, True, 0.020, 2.0), _result(20.0, True)]  # fmt: skip
    w = window_figures(results, 10.0, 20.0)
    assert (w["requests"], w["failed"]) == (3, 1)
    assert w["mean_ttft_ms"] == 25.0 and w["p50_ttft_ms"] == 25.0
    assert w["mean_e2el_ms"] == 2500.0 and w["p99_e2el_ms"] == 2990.0
    empty = window_figures(results, 30.0, 40.0)
    assert empty["requests"] == 0 and empty["p50_ttft_ms"] is None


PROXY = """# HELP ucmctl_proxy_retries_total x
ucmctl_proxy_retries_total{leg="decode"} 3
ucmctl_proxy_retries_total{leg="prefill"} 2
ucmctl_proxy_first_token_retries_total{leg="decode"} 1
ucmctl_proxy_errors_total{reason="upstream_mid_stream"} 4
ucmctl_proxy_errors_total{reason="upstream"} 7
ucmctl_proxy_migrations_total{outcome="resumed"} 2
ucmctl_proxy_migrations_total{outcome="not_continued"} 1
ucmctl_proxy_migrations_total{outcome="failed"} 1
ucmctl_proxy_instance_requests_streaming{instance="http://a:1",role="decode"} 2
ucmctl_proxy_instance_requests_streaming{instance="http://a:10",role="decode"} 9
ucmctl_proxy_instance_requests_in_flight{instance="http://a:1",role="decode"} 3
"""


def test_the_proxy_is_read_for_the_victim_only_and_the_counters_over_the_rest_of_the_phase() -> None:
    before = proxy_samples(PROXY, "http://a:1")
    assert before == {"retries": 5, "first_token_retries": 1, "mid_stream": 4, "streaming": 2, "in_flight": 3,
                      "migrated": 2, "not_migrated": 2}  # fmt: skip
    later = PROXY.replace("} 3\n", "} 6\n", 1).replace("} 4\n", "} 7\n")
    end = proxy_samples(later.replace('"resumed"} 2', '"resumed"} 4'), "http://a:1")
    cost = cost_at_proxy(before, None, end)
    assert cost == {"streaming_on_it": 2, "in_flight_on_it": 3, "cut_mid_stream": 3, "migrated": 2,
                    "not_migrated": 0, "retried": 3, "retried_before_first_token": 0}  # fmt: skip
    # read again just after the signal: one more had begun streaming (2 cut by then, 1 left)
    just_after = {**before, "mid_stream": 6.0, "streaming": 1.0, "in_flight": 1.0}
    assert cost_at_proxy(before, just_after, end)["streaming_on_it"] == 3
    assert cost_at_proxy(before, just_after, end)["in_flight_on_it"] == 3  # 3 before, 1 + 2 after
    assert set(cost_at_proxy(None, None, None).values()) == {None}  # no proxy: unknown, not 0


def test_the_proxy_as_victim_counts_every_instance_and_its_counts_die_with_it() -> None:
    before = proxy_samples(PROXY, ALL)
    assert (before["streaming"], before["in_flight"]) == (11, 3)
    restarted = proxy_samples(PROXY.replace("} 3\n", "} 0\n", 1), ALL)  # it began again from 0
    cost = cost_at_proxy(before, None, restarted)
    assert cost["streaming_on_it"] == 11 and cost["cut_mid_stream"] is None and cost["retried"] is None


def test_the_resume_gap_is_the_moved_answers_step_across_the_fault() -> None:
    """Of the answers streaming across the fault, the `migrated` longest steps around it."""
    moved = [RequestResult(0, 10, ok=True, ttft=0.1, itl=[0.01] * 5 + [g] + [0.01] * 5, start_time=9.0)
             for g in (0.3, 0.5)]  # fmt: skip
    # its tokens at 9.10 .. 9.15, then 9.15 + gap: the fault at 9.2 falls in the gap
    steady = RequestResult(1, 10, ok=True, ttft=0.1, itl=[0.02] * 40, start_time=9.0)
    later = RequestResult(2, 10, ok=True, ttft=0.1, itl=[0.5], start_time=9.5)  # began after it
    failed = RequestResult(3, 10, ok=False, start_time=9.0)
    gaps = resume_gaps([*moved, steady, later, failed], 9.2, 2)
    assert gaps == {"answers": 2, "p50": 400.0, "p99": 498.0}
    assert resume_gaps([steady], 9.2, 0) is None and resume_gaps([later], 9.2, 1) is None
    f = {"injected": True, "spec": "kill:d@1s", "into_s": 1.0, "was_running": True, "failed": 0,
         "cut_mid_stream": 2, "migrated": 2, "not_migrated": 0, "resume_gap_ms": gaps}  # fmt: skip
    lines = fault_lines("x", {**f, "window_s": 1, "before": _WINDOW, "after": _WINDOW})
    assert "  moved to another instance 2, not 0; resume gap p50 400 p99 498 ms" in lines
    assert max(len(line) for line in lines) <= 80


_WINDOW = {"requests": 1, "failed": 0, "p50_ttft_ms": 1.0, "p99_ttft_ms": 1.0, "p50_e2el_ms": 1.0}


def test_a_fault_whose_time_never_came_says_so() -> None:
    fired: list[bool] = []
    fault = Fault(FaultSpec("kill", "decode-0", 30.0), lambda: fired.append(True) or True)
    assert not fault.wants("preseed 64 tokens") and fault.wants("measure 64 tokens")
    assert not fault.wants("measure 128 tokens")  # the first measure phase only

    async def go() -> dict[str, Any]:
        import aiohttp

        async with aiohttp.ClientSession() as http:
            task = asyncio.ensure_future(fault.during(http, 0.0 + asyncio.get_running_loop().time()))
            await asyncio.sleep(0)  # the task runs up to its wait for the fault's time
            task.cancel()
            return await fault.report(http, [], 12.0)

    report = asyncio.run(go())
    assert fired == [] and report["injected"] is False
    assert report["why"] == "the phase ended 12 s in, before 30 s"
    assert fault_lines("measure 64", report) == [
        "measure 64: fault kill:decode-0@30s not injected: the phase ended 12 s in, before 30 s"
    ]


def test_a_fault_is_sent_at_its_time_and_reported() -> None:
    fault = Fault(FaultSpec("kill", "decode-0", 0.2), lambda: True)
    assert fault.wants("measure 64 tokens")

    async def go() -> dict[str, Any]:
        import time

        import aiohttp

        start = time.perf_counter()
        async with aiohttp.ClientSession() as http:
            await fault.during(http, start)
            sent = time.perf_counter()  # just after the signal went
            assert 0.2 <= sent - start < 0.5
            results = [_result(sent - 0.5, True, 0.01, 0.5), _result(sent - 0.1, False),
                       _result(sent + 0.05, True, 0.02, 0.6)]  # fmt: skip
            return await fault.report(http, results, 1.0)

    f = asyncio.run(go())
    assert f["injected"] and f["was_running"] and 0.4 <= f["into_s"] <= 0.5  # from the first request
    assert f["failed"] == 1 and f["failed_sent_after"] == 0 and f["window_s"] == 0.2
    assert (f["before"]["requests"], f["before"]["failed"]) == (1, 1)  # the first: > 0.2 s before
    assert (f["after"]["requests"], f["after"]["failed"]) == (1, 0)
    assert f["detected_after_s"] is None and f["streaming_on_it"] is None
    lines = fault_lines("measure 64", f)
    assert lines[0].startswith("measure 64: fault kill:decode-0@0.2s sent 0.")
    assert lines[2] == "  failed 1 (0 of them sent after it)"
    assert "not reported lost; not back" in lines[4] and all(len(x) <= 80 for x in lines)


def test_of_two_proxy_replicas_the_dead_ones_gauges_are_read_and_the_living_ones_counters() -> None:
    """kill:proxy-1 of two replicas: what proxy-1 carried is its gauges (every instance's) read
    before the kill; the counters are proxy-0's, which live on (proxy-1's die with it)."""
    from aiohttp import web

    from tests.support.http import serve

    texts = {0: PROXY, 1: PROXY.replace("} 9\n", "} 4\n")}  # proxy-1 streams 2 + 4

    async def go() -> tuple[dict | None, dict | None]:
        import aiohttp

        runners, urls = [], []
        for k in (0, 1):

            async def metrics(_request: web.Request, k: int = k) -> web.Response:
                return web.Response(text=texts[k])

            app = web.Application()
            app.router.add_get("/metrics", metrics)
            url, runner = await serve(app)
            runners.append(runner)
            urls.append(url)
        fault = Fault(FaultSpec("kill", "proxy-1", 1.0), lambda: True, proxy_urls=urls, victim_url=ALL,
                      victim_proxy=urls[1])  # fmt: skip
        async with aiohttp.ClientSession() as http:
            before = await fault._proxy_samples(http)
            await runners[1].cleanup()  # proxy-1 is gone
            after = await fault._proxy_samples(http)
        await runners[0].cleanup()
        return before, after

    before, after = asyncio.run(go())
    assert before is not None and after is not None
    assert (before["streaming"], before["in_flight"]) == (6, 3)  # proxy-1's own
    assert before["mid_stream"] == 4 and before["retries"] == 5  # proxy-0's alone
    assert "streaming" not in after and after["mid_stream"] == 4
    cost = cost_at_proxy(before, None, after)
    assert cost["streaming_on_it"] == 6 and cost["cut_mid_stream"] == 0 and cost["retried"] == 0
    lines = fault_lines("m", {"injected": True, "spec": "kill:proxy-1@1s", "into_s": 1.0, "was_running": True,
                              "failed": 3, "failed_sent_after": 0, "sent_on": 5, **cost, "window_s": 1,
                              "before": _WINDOW, "after": _WINDOW})  # fmt: skip
    assert "  5 sent on to another proxy when theirs refused the connection" in lines


def test_a_hung_process_is_let_go_once_when_its_phase_is_reported() -> None:
    """`hang:` (SIGSTOP): the report lets the process go on (SIGCONT) before it reads anything,
    once; a fault never fired lets nothing go; its first line says so."""
    sent: list[str] = []
    fault = Fault(FaultSpec("hang", "decode-1", 0.05), lambda: sent.append("STOP") or True,
                  release=lambda: sent.append("CONT") or True)  # fmt: skip
    assert fault.let_go() is False and sent == []  # not fired: nothing to let go

    async def go() -> dict[str, Any]:
        import time

        import aiohttp

        async with aiohttp.ClientSession() as http:
            await fault.during(http, time.perf_counter())
            return await fault.report(http, [_result(time.perf_counter(), True)], 1.0)

    f = asyncio.run(go())
    assert sent == ["STOP", "CONT"] and f["released"] is True
    assert fault.let_go() is False and sent == ["STOP", "CONT"]  # once
    first = fault_lines("measure 64", f)[0]
    assert first.endswith("s in; let go at the phase's end") and len(first) <= 80, first
