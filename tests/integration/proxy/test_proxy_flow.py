"""The PD flow against simulator instances: both legs, relayed answers, routing, errors, admin routes."""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from .conftest import PD
from .procs import completion, get, metric, post, sse_events


def test_stream_is_relayed_as_sse_with_request_id(pd: PD) -> None:
    status, headers, raw = post(pd.proxy.url + "/v1/completions", completion(8, stream=True),
                                headers={"X-Request-Id": "rid-stream-1"})  # fmt: skip
    assert status == 200
    assert headers["Content-Type"].startswith("text/event-stream")
    assert headers["X-Request-Id"] == "rid-stream-1"
    events = sse_events(raw)
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert len(chunks) == 8
    assert {c["id"] for c in chunks} == {"cmpl-rid-stream-1"}  # the decode leg carried the client's id
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"


def test_non_streaming_and_chat(pd: PD) -> None:
    status, headers, raw = post(pd.proxy.url + "/v1/completions", completion(5))
    assert status == 200 and headers["Content-Type"].startswith("application/json")
    body = json.loads(raw)
    assert body["usage"]["completion_tokens"] == 5
    assert body["id"] == f"cmpl-{headers['X-Request-Id']}"  # an id was made up and used on the legs
    chat = {
        "model": "sim-model",
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 3,
        "stream": True,
    }
    status, headers, raw = post(pd.proxy.url + "/v1/chat/completions", chat)
    assert status == 200 and headers["Content-Type"].startswith("text/event-stream")
    chunks = [json.loads(e) for e in sse_events(raw)[:-1]]
    assert chunks[0]["object"] == "chat.completion.chunk"
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks).strip()


def test_n_choices_pass_through_both_legs(pd: PD) -> None:
    """`n: 2` as clients send it (the openai client's n): the prefill leg asks for it too and
    is cut to one token, the decode leg streams both choices."""
    status, _, raw = post(pd.proxy.url + "/v1/completions", {**completion(4, stream=True), "n": 2})
    assert status == 200
    chunks = [json.loads(e) for e in sse_events(raw)[:-1]]
    per_choice = [sum(1 for c in chunks for ch in c["choices"] if ch["index"] == i) for i in (0, 1)]
    assert per_choice == [4, 4], chunks
    status, _, raw = post(pd.proxy.url + "/v1/completions", {**completion(3), "n": 2})
    body = json.loads(raw)
    assert sorted(c["index"] for c in body["choices"]) == [0, 1] and body["usage"]["completion_tokens"] == 6


def test_prefill_leg_is_one_token_and_p2p_params_reach_decode(pd: PD) -> None:
    pre, dec = pd.prefill[0], pd.decode[0]
    gen_before = metric(pre.url, "vllm:generation_tokens_total")
    done_before = metric(pre.url, "vllm:request_success_total")
    # a whole answer that cannot be continued elsewhere (a penalty) goes to decode as it came
    whole = {**completion(6), "presence_penalty": 0.5}
    status, _, raw = post(pd.p2p.url + "/v1/completions", whole, headers={"X-Request-Id": "rid-p2p"})
    assert status == 200
    body = json.loads(raw)
    # the prefill sim answered do_remote_decode with where the KV is; the decode sim echoes what it got
    kv = body["kv_transfer_params"]
    assert kv["do_remote_prefill"] is True and kv["do_remote_decode"] is False
    assert kv["remote_port"] == pre.port and kv["request_id"] == "rid-p2p"  # same id on the prefill leg
    assert body["id"] == "cmpl-rid-p2p" and body["usage"]["completion_tokens"] == 6
    assert body["usage"]["prompt_tokens_details"]["cached_tokens"] > 0  # decode took the KV as remote
    assert metric(pre.url, "vllm:generation_tokens_total") - gen_before == 1  # max_tokens=1 on prefill
    assert metric(pre.url, "vllm:request_success_total") - done_before == 1
    assert metric(dec.url, "vllm:num_requests_running") == 0


def test_streamed_p2p_request_gets_the_prefillers_params_too(pd: PD) -> None:
    body = completion(4, stream=True)
    body["stream_options"] = {"include_usage": True}
    status, _, raw = post(pd.p2p.url + "/v1/completions", body)
    assert status == 200
    chunks = [json.loads(e) for e in sse_events(raw)[:-1]]
    assert chunks[-1]["usage"]["completion_tokens"] == 4  # stream_options kept on the decode leg
    assert chunks[-1]["usage"]["prompt_tokens_details"]["cached_tokens"] > 0  # remote KV was used


def test_without_p2p_no_kv_params_are_sent(pd: PD) -> None:
    status, _, raw = post(pd.proxy.url + "/v1/completions", completion(2))
    assert status == 200
    assert json.loads(raw)["kv_transfer_params"] is None


def test_routing_spreads_load_over_instances(pd: PD) -> None:
    before = {p.url: metric(p.url, "vllm:request_success_total") for p in [*pd.prefill, *pd.decode]}
    n = 24
    prompts: list[Any] = [[100 + i, 7, 8, 9] for i in range(n)]
    with ThreadPoolExecutor(8) as pool:
        statuses = list(
            pool.map(lambda p: post(pd.proxy.url + "/v1/completions", completion(16, True, p))[0], prompts)
        )
    assert statuses == [200] * n
    done = {
        p.url: metric(p.url, "vllm:request_success_total") - before[p.url] for p in [*pd.prefill, *pd.decode]
    }
    for side in (pd.prefill, pd.decode):
        counts = [done[p.url] for p in side]
        assert sum(counts) == n
        assert min(counts) >= n // 4, f"one instance got {counts} of {n}"
    # the proxy's own per-instance counters agree with the instances'
    for p in pd.decode:
        assert metric(pd.proxy.url, "ucmctl_proxy_instance_requests_total", instance=p.url) >= done[p.url]


def test_bad_requests_get_400_with_reason(pd: PD) -> None:
    url = pd.proxy.url
    before = metric(pd.prefill[0].url, "vllm:request_success_total") + metric(
        pd.prefill[1].url, "vllm:request_success_total"
    )
    cases = [
        (url + "/v1/completions", b'{"model": "sim-model", "prompt": ', "not valid JSON"),
        (url + "/v1/completions", {"model": "sim-model"}, "missing field 'prompt'"),
        (url + "/v1/chat/completions", {"model": "sim-model"}, "missing field 'messages'"),
        (
            url + "/v1/completions",
            {"prompt": "x", "max_tokens": 0},
            "'max_tokens' must be a positive integer",
        ),
    ]
    for target, body, reason in cases:
        status, _, raw = post(target, body)
        assert status == 400
        assert reason in json.loads(raw)["error"]["message"]
    after = metric(pd.prefill[0].url, "vllm:request_success_total") + metric(
        pd.prefill[1].url, "vllm:request_success_total"
    )
    assert after == before  # nothing went upstream
    assert metric(url, "ucmctl_proxy_errors_total", reason="bad_request") >= len(cases)


def test_upstream_refusal_is_relayed(pd: PD) -> None:
    status, _, raw = post(pd.proxy.url + "/v1/completions", completion(40000))  # past max_model_len
    assert status == 400
    assert "maximum context length" in json.loads(raw)["error"]["message"]
    # stream_options on an answer asked for whole: the engine's 400 (the proxy, which streams
    # the whole answers it can move, must not answer what the engine refuses)
    usage = {**completion(4), "stream_options": {"include_usage": True}}
    for url in (pd.proxy.url, pd.decode[0].url):
        status, _, raw = post(url + "/v1/completions", usage)
        assert status == 400, url
        assert json.loads(raw)["error"]["message"] == "Stream options can only be defined when `stream=True`."


def test_models_health_metrics_reset(pd: PD) -> None:
    status, _, raw = get(pd.proxy.url + "/v1/models")
    assert status == 200 and json.loads(raw)["data"][0]["id"] == "sim-model"
    status, _, raw = get(pd.proxy.url + "/health")
    assert status == 200 and json.loads(raw)["healthy"] == {"prefill": 2, "decode": 2}
    status, _, raw = post(pd.proxy.url + "/reset_prefix_cache")
    report = json.loads(raw)
    assert status == 200 and report["ok"]
    assert {i["url"] for i in report["instances"]} == {p.url for p in [*pd.prefill, *pd.decode]}
    assert all(i["result"] == 200 for i in report["instances"])
    assert metric(pd.proxy.url, "ucmctl_proxy_ttft_seconds_count") > 0
    assert metric(pd.proxy.url, "ucmctl_proxy_instance_healthy", role="decode") == 2


def test_instances_remove_and_add(pd: PD) -> None:
    url, gone = pd.proxy.url, pd.decode[0]
    status, _, _ = post(url + "/instances/remove", {"url": gone.url, "role": "decode"})
    assert status == 200
    try:
        before = metric(gone.url, "vllm:request_success_total")
        for _ in range(4):
            assert post(url + "/v1/completions", completion(2))[0] == 200
        assert metric(gone.url, "vllm:request_success_total") == before  # out of routing
        assert post(url + "/instances/remove", {"url": gone.url})[0] == 404
        assert post(url + "/instances/add", {"url": "not a url", "role": "decode"})[0] == 400
        assert post(url + "/instances/add", {"url": gone.url, "role": "mixed"})[0] == 400  # not in pd mode
    finally:
        status, _, raw = post(url + "/instances/add", {"url": gone.url, "role": "decode"})
    assert status == 200 and json.loads(raw) == {
        "added": True,
        "url": gone.url,
        "role": "decode",
        "healthy": True,
    }
    before = metric(gone.url, "vllm:request_success_total")
    for _ in range(4):
        assert post(url + "/v1/completions", completion(2))[0] == 200
    assert metric(gone.url, "vllm:request_success_total") > before  # back in routing


def test_a_drained_instance_gets_nothing_new_and_says_what_is_in_flight(pd: PD) -> None:
    url, drained = pd.proxy.url, pd.decode[0]
    status, _, raw = post(url + "/instances/drain", {"url": drained.url, "role": "decode"})
    assert status == 200 and json.loads(raw)["instances"][0]["draining"] is True
    try:
        before = metric(drained.url, "vllm:request_success_total")
        for _ in range(4):
            assert post(url + "/v1/completions", completion(2))[0] == 200
        assert metric(drained.url, "vllm:request_success_total") == before  # nothing new went there
        listed = json.loads(get(url + "/instances")[2])["instances"]
        mine = next(i for i in listed if i["url"] == drained.url)  # still listed, with its count
        assert mine["draining"] is True and mine["requests_in_flight"] == 0 and mine["healthy"] is True
        assert metric(url, "ucmctl_proxy_instance_draining", instance=drained.url) == 1
        assert json.loads(get(url + "/health")[2])["healthy"]["decode"] == 1
        assert post(url + "/instances/drain", {"url": "http://127.0.0.1:1", "role": "decode"})[0] == 404
        # a bad body is a 400 that says what is wrong, not a server error
        bodies = [(b"{not json", "not valid JSON"), ({"url": drained.url, "move_after": -1}, "move_after"),
                  ({"url": drained.url, "move_after": True}, "move_after")]  # fmt: skip
        for bad, said in bodies:
            status, _, raw = post(url + "/instances/drain", bad)
            assert status == 400 and said in json.loads(raw)["error"]["message"], raw
    finally:
        status, _, raw = post(url + "/instances/resume", {"url": drained.url, "role": "decode"})
    assert status == 200 and json.loads(raw)["instances"][0]["draining"] is False
    before = metric(drained.url, "vllm:request_success_total")
    for _ in range(4):
        assert post(url + "/v1/completions", completion(2))[0] == 200
    assert metric(drained.url, "vllm:request_success_total") > before  # routed to again


def test_ttft_is_small_on_an_idle_setup(pd: PD) -> None:
    # a sanity bound, far above the benchmark's target: catches a proxy that buffers the answer
    t0 = time.perf_counter()
    status, _, _ = post(pd.proxy.url + "/v1/completions", completion(1))
    assert status == 200 and time.perf_counter() - t0 < 2.0
