"""Metric definitions against hand computation (vLLM's bench), and the stream parsing."""

from __future__ import annotations

import json

import numpy as np
import pytest

from ucmctl.bench.client import RequestResult, _finish, has_choices, make_body
from ucmctl.bench.metrics import summarize


def req(i: int, ttft: float, itl: list[float], out: int, ok: bool = True) -> RequestResult:
    r = RequestResult(i, 100, ok=ok, output_tokens=out, ttft=ttft, itl=itl, usage_prompt_tokens=100)
    r.latency = ttft + sum(itl)
    if not ok:
        r.error = "HTTP 500: boom"
    return r


def test_summary_matches_vllm_definitions() -> None:
    rs = [
        req(0, 0.1, [0.01, 0.03], 3),
        req(1, 0.3, [0.02] * 4, 5),
        req(2, 0.2, [], 1),
        req(3, 9.0, [], 0, ok=False),
    ]
    s = summarize(rs, duration=2.0)
    assert s["completed"] == 3 and s["failed"] == 1
    assert s["total_input_tokens"] == 300 and s["total_output_tokens"] == 9
    assert s["request_throughput"] == pytest.approx(1.5) and s["output_throughput"] == pytest.approx(4.5)
    assert s["total_token_throughput"] == pytest.approx(154.5)
    ttfts = np.array([0.1, 0.3, 0.2]) * 1000
    assert s["mean_ttft_ms"] == pytest.approx(200.0)
    assert s["median_ttft_ms"] == pytest.approx(200.0)
    assert s["std_ttft_ms"] == pytest.approx(ttfts.std())  # population std, as numpy / vLLM
    assert s["p99_ttft_ms"] == pytest.approx(np.percentile(ttfts, 99))
    # TPOT only for outputs > 1 token: (e2el - ttft) / (out - 1)
    assert s["mean_tpot_ms"] == pytest.approx(np.mean([0.04 / 2, 0.08 / 4]) * 1000)
    assert s["mean_itl_ms"] == pytest.approx(np.mean([0.01, 0.03, 0.02, 0.02, 0.02, 0.02]) * 1000)
    assert s["mean_e2el_ms"] == pytest.approx(np.mean([0.14, 0.38, 0.2]) * 1000)
    assert s["errors"] == [{"error": "HTTP 500: boom", "count": 1}]


def test_token_events_are_recognised_without_decoding() -> None:
    assert has_choices(b'data: {"id":"x","choices":[{"index":0,"text":"a"}],"usage":null}')
    assert has_choices(b'data: {"id": "x", "choices": [ {"index": 0, "text": ""}]}')
    assert not has_choices(b'data: {"id":"x","choices":[],"usage":{"prompt_tokens":3}}')
    assert not has_choices(b'data: {"id": "x", "choices": [ ], "usage": {}}')
    assert not has_choices(b"data: [DONE]")
    assert not has_choices(b'data: {"error":{"message":"x"}}')


def _usage(prompt: int, completion: int) -> bytes:
    body = {
        "choices": [],
        "usage": {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "prompt_tokens_details": {"cached_tokens": 64},
        },
    }
    return b"data: " + json.dumps(body).encode()


def test_usage_decides_counts_and_checks_the_prompt_length() -> None:
    ok = RequestResult(0, 100)
    _finish(ok, [_usage(100, 7), b"data: [DONE]"], got_token=True)
    assert ok.ok and ok.output_tokens == 7 and ok.cached_tokens == 64
    short = RequestResult(0, 100)
    _finish(short, [_usage(99, 7)], got_token=True)
    assert not short.ok and "usage.prompt_tokens 99 != 100" in short.error
    no_usage = RequestResult(0, 100)
    _finish(no_usage, [b"data: [DONE]"], got_token=True)
    assert not no_usage.ok and "no usage" in no_usage.error
    err = RequestResult(0, 100)
    _finish(err, [b'data: {"error": {"message": "engine died"}}'], got_token=True)
    assert not err.ok and "engine died" in err.error
    no_token = RequestResult(0, 100)
    _finish(no_token, [_usage(100, 0)], got_token=False)
    assert not no_token.ok and "TTFT" in no_token.error


def test_body_is_token_ids_with_usage_requested() -> None:
    body = json.loads(make_body([5, 6, 7], 10, "m", True, 0.0))
    assert body == {
        "prompt": [5, 6, 7],
        "max_tokens": 10,
        "stream": True,
        "ignore_eos": True,
        "model": "m",
        "stream_options": {"include_usage": True},
        "temperature": 0.0,
    }
    assert "model" not in json.loads(make_body([1], 1, None, False, None))
    assert json.loads(make_body([1], 1, None, False, None, cache_salt="s1"))["cache_salt"] == "s1"
    assert "cache_salt" not in json.loads(make_body([1], 1, None, False, None, cache_salt=None))


def test_a_phase_with_no_answer_has_no_latency_figures() -> None:
    """Nothing measured is None (null in JSON, `-` in tables), never a made-up 0."""
    from ucmctl.bench.client import RequestResult
    from ucmctl.bench.metrics import summarize

    s = summarize(
        [RequestResult(0, 100, error="HTTP 400: x"), RequestResult(1, 100, error="HTTP 400: x")], 1.0
    )
    assert (s["completed"], s["failed"]) == (0, 2)
    assert all(s[f"{stat}_{m}_ms"] is None for m in ("ttft", "tpot", "itl", "e2el")
               for stat in ("mean", "median", "std", "p90", "p99"))  # fmt: skip
    one_token = summarize([RequestResult(0, 100, ok=True, output_tokens=1, ttft=0.1, latency=0.1)], 1.0)
    assert one_token["mean_ttft_ms"] == 100.0 and one_token["mean_tpot_ms"] is None


def test_a_body_names_its_conversation_as_openais_user_when_given() -> None:
    assert "user" not in json.loads(make_body([5, 6, 7], 10, "m", True, 0.0))
    body = json.loads(make_body([5], 1, None, True, None, user="ucmctl-bench-0-0-3"))
    assert body["user"] == "ucmctl-bench-0-0-3"
