"""The simulator over HTTP: protocol, prefix caching (local and through the native store),
contention and cancellation, each against real `ucmctl sim serve` processes."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import aiohttp
import pytest

from tests.support.http import get, post
from tests.support.openai_checks import (
    check_chat,
    check_chat_stream,
    check_completion,
    check_completion_stream,
    check_error,
    metric,
    parse_sse,
)
from tests.support.processes import sim_server

BLOCK = 16


def ucm_config(tmp: Path, store: Path) -> Path:
    path = tmp / "ucm.yaml"
    path.write_text(
        "ucm_connectors:\n  - ucm_connector_name: UcmPipelineStore\n    ucm_connector_config:\n"
        f'      store_pipeline: "Cache|Posix"\n      storage_backends: "{store}"\n'
        "      cache_buffer_capacity_gb: 0.25\n"
    )
    return path


def kv_flag(config: Path) -> list[str]:
    kv = {"kv_connector": "UCMConnector", "kv_role": "kv_both",
          "kv_connector_module_path": "ucm_connector.connector",
          "kv_connector_extra_config": {"UCM_CONFIG_FILE": str(config)}}  # fmt: skip
    return ["--kv-transfer-config", json.dumps(kv)]


def shared_store(tmp: Path) -> tuple[Path, list[str]]:
    """A store folder and the flags of a simulator that loads from and saves to it."""
    store = tmp / "store"
    store.mkdir()
    return store, [
        "--block-size",
        str(BLOCK),
        *kv_flag(ucm_config(tmp, store)),
        "--kv-bytes-per-token",
        "4096",
    ]


def test_protocol_conformance(tmp_path: Path) -> None:
    with sim_server(tmp_path, "--block-size", str(BLOCK), "--max-model-len", "512", "--seed", "1") as sim:
        prompt = list(range(1, 101))
        status, body = post(
            f"{sim.url}/v1/completions", {"model": "sim-model", "prompt": prompt, "max_tokens": 7}
        )
        assert status == 200
        check_completion(body, prompt_tokens=100, max_tokens=7)
        status, raw = post(
            f"{sim.url}/v1/completions",
            {"prompt": prompt, "max_tokens": 5, "stream": True, "stream_options": {"include_usage": True}},
            raw=True,
        )
        pieces = check_completion_stream(parse_sse(raw), prompt_tokens=100, max_tokens=5)
        assert len(pieces) == 5
        chat = {"messages": [{"role": "user", "content": "hello there"}], "max_tokens": 4}
        status, body = post(f"{sim.url}/v1/chat/completions", chat)
        check_chat(body, max_tokens=4)
        status, raw = post(
            f"{sim.url}/v1/chat/completions",
            {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "stream": True,
             "stream_options": {"include_usage": True}},
            raw=True,
        )  # fmt: skip
        check_chat_stream(parse_sse(raw), max_tokens=3)
        models = json.loads(get(f"{sim.url}/v1/models"))
        assert models["data"][0]["id"] == "sim-model" and models["data"][0]["max_model_len"] == 512
        # vLLM-like 400s
        assert "not valid JSON" in check_error(*post(f"{sim.url}/v1/completions", b"{nope"))
        assert "maximum context length is 512" in check_error(
            *post(f"{sim.url}/v1/completions", {"prompt": prompt, "max_tokens": 500})
        )
        assert "max_tokens" in check_error(
            *post(f"{sim.url}/v1/completions", {"prompt": prompt, "max_tokens": 0})
        )
        assert "prompt" in check_error(*post(f"{sim.url}/v1/completions", {"max_tokens": 3}))
        # a model it does not serve: vLLM's 404 (the openai client raises NotFoundError on it)
        other = {"model": "gpt-4", "prompt": prompt, "max_tokens": 1}
        status, body = post(f"{sim.url}/v1/completions", other)
        assert status == 404 and body["error"]["type"] == "NotFoundError" and body["error"]["code"] == 404
        assert body["error"]["message"] == "The model `gpt-4` does not exist. Valid aliases: sim-model."
        # kv_transfer_params: a P2P prefill leg gets back where its KV is
        leg = {"prompt": prompt, "max_tokens": 1, "kv_transfer_params": {"do_remote_decode": True}}
        status, body = post(f"{sim.url}/v1/completions", leg)
        params = body["kv_transfer_params"]
        assert params["do_remote_prefill"] is True and params["remote_block_ids"] == list(range(100 // BLOCK))
    assert "ignoring flags it does not model" not in sim.log.read_text()  # --seed is accepted


def test_unknown_flags_get_one_warning_line(tmp_path: Path) -> None:
    with sim_server(tmp_path, "--gpu-memory-utilization", "0.9", "--enforce-eager") as sim:
        pass
    warnings = [line for line in sim.log.read_text().splitlines() if "ignoring flags" in line]
    assert len(warnings) == 1 and "--gpu-memory-utilization --enforce-eager" in warnings[0]


def test_load_seconds_keep_the_port_closed_like_a_loading_server(tmp_path: Path) -> None:
    t0 = time.monotonic()
    with sim_server(tmp_path, "--load-seconds", "1.5") as s:
        assert time.monotonic() - t0 >= 1.5  # the health gate could not pass earlier
        assert "waiting 1.5 s before serving" in s.log.read_text()
        assert get(f"{s.url}/v1/models")  # and serves once loaded


def test_local_prefix_cache_hits_and_reset(tmp_path: Path) -> None:
    with sim_server(tmp_path, "--block-size", str(BLOCK)) as sim:
        prompt = list(range(1, 101))  # 6 full blocks; hits stop one token short of the prompt
        post(f"{sim.url}/v1/completions", {"prompt": prompt, "max_tokens": 1})
        _, body = post(f"{sim.url}/v1/completions", {"prompt": prompt + [5] * 20, "max_tokens": 1})
        assert body["usage"]["prompt_tokens_details"] == {"cached_tokens": 96}
        text = get(f"{sim.url}/metrics")
        assert metric(text, "vllm:prefix_cache_queries_total") == 100 + 120
        assert metric(text, "vllm:prefix_cache_hits_total") == 96
        assert post(f"{sim.url}/reset_prefix_cache", {}, raw=True)[0] == 200
        _, body = post(f"{sim.url}/v1/completions", {"prompt": prompt, "max_tokens": 1})
        assert body["usage"]["prompt_tokens_details"] is None
        # vLLM's cache_salt enters every block key: another salt shares nothing, the same one all
        salted = {"prompt": prompt + [5] * 20, "max_tokens": 1, "cache_salt": "run-1"}
        _, body = post(f"{sim.url}/v1/completions", salted)
        assert body["usage"]["prompt_tokens_details"] is None  # the unsalted blocks are not its
        _, body = post(f"{sim.url}/v1/completions", {**salted, "prompt": prompt})
        assert body["usage"]["prompt_tokens_details"] == {"cached_tokens": 96}
        _, body = post(f"{sim.url}/v1/completions", {**salted, "prompt": prompt, "cache_salt": "run-2"})
        assert body["usage"]["prompt_tokens_details"] is None
        for bad in ("", "a/b", "x" * 129):  # vLLM 0.32's rule
            refused = post(f"{sim.url}/v1/completions", {**salted, "cache_salt": bad})
            assert "cache_salt" in check_error(*refused)
    with sim_server(tmp_path, "--block-size", str(BLOCK), "--no-enable-prefix-caching") as sim:
        for _ in range(2):
            post(f"{sim.url}/v1/completions", {"prompt": prompt, "max_tokens": 1})
        assert metric(get(f"{sim.url}/metrics"), "vllm:prefix_cache_hits_total") == 0


def test_external_hits_across_instances_sharing_a_store(tmp_path: Path) -> None:
    store, flags = shared_store(tmp_path)
    prompt = list(range(1, 201))  # 12 full blocks, 12 usable (199 // 16)
    with sim_server(tmp_path, *flags) as a, sim_server(tmp_path, *flags) as b:
        post(f"{a.url}/v1/completions", {"prompt": prompt, "max_tokens": 1})
        # A's dumps land in its DRAM tier first; B sees them once written through to the files.
        deadline = time.monotonic() + 10
        while len(files := [p for p in store.rglob("*") if p.is_file()]) < 12 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(files) == 12  # one real block file per full block
        assert all(f.stat().st_size >= 16 * 4096 for f in files)
        _, body = post(f"{b.url}/v1/completions", {"prompt": prompt + [7] * 40, "max_tokens": 1})
        assert body["usage"]["prompt_tokens_details"] == {"cached_tokens": 192}
        text = get(f"{b.url}/metrics")
        assert metric(text, "vllm:external_prefix_cache_hits_total") == 192
        assert metric(text, "vllm:external_prefix_cache_queries_total") == 240
        assert metric(text, "vllm:prefix_cache_hits_total") == 0
        # After a reset of B's local cache only the store can hit, and it does.
        post(f"{b.url}/reset_prefix_cache", {}, raw=True)
        _, body = post(f"{b.url}/v1/completions", {"prompt": prompt, "max_tokens": 1})
        assert body["usage"]["prompt_tokens_details"] == {"cached_tokens": 192}


def test_an_answer_continued_on_another_instance_is_the_same_answer(tmp_path: Path) -> None:
    """The simulator's tokens are a function of the context (as a greedy model's): an answer cut
    after k tokens and continued on another instance (its prompt then the k tokens, as a proxy
    migrating a stream sends it) goes on with the same tokens, and that instance loads the blocks
    the first one saved (the prompt's and the answer's) from the store."""
    store, flags = shared_store(tmp_path)
    prompt = [(n * 13) % 900 + 5 for n in range(200)]
    with sim_server(tmp_path, *flags) as a, sim_server(tmp_path, *flags) as b:
        body = {"prompt": prompt, "max_tokens": 60, "return_token_ids": True}
        _, whole = post(f"{a.url}/v1/completions", body)
        tokens = whole["choices"][0]["token_ids"]
        assert len(tokens) == 60 and len(set(tokens)) > 16
        k = 41  # 241 tokens of context: 15 full blocks before its last token, two of them answer tokens
        deadline = time.monotonic() + 10
        while len([f for f in store.rglob("*") if f.is_file()]) < 15 and time.monotonic() < deadline:
            time.sleep(0.05)
        rest = {"prompt": [*prompt, *tokens[:k]], "max_tokens": 60 - k, "return_token_ids": True}
        _, continued = post(f"{b.url}/v1/completions", rest)
        assert continued["choices"][0]["token_ids"] == tokens[k:]
        assert continued["usage"]["prompt_tokens_details"] == {"cached_tokens": 15 * BLOCK}  # from the store
        status, raw = post(f"{b.url}/v1/completions", {**rest, "stream": True}, raw=True)
        streamed = [t for c in parse_sse(raw) if isinstance(c, dict) for t in c["choices"][0]["token_ids"]]
        assert status == 200 and streamed == tokens[k:]


async def _ttft(url: str, prompt: list[int]) -> float:
    start = time.monotonic()
    async with aiohttp.ClientSession() as s:
        body = {"prompt": prompt, "max_tokens": 2, "stream": True}
        async with s.post(f"{url}/v1/completions", json=body) as r:
            async for line in r.content:
                if line.startswith(b"data: {") and b'"text"' in line:
                    return time.monotonic() - start
    raise AssertionError("no token came")


def test_contention_makes_ttft_grow_with_concurrency(tmp_path: Path) -> None:
    flags = ["--prefill-us-per-token", "400", "--max-num-batched-tokens", "1024", "--block-size", str(BLOCK)]
    with sim_server(tmp_path, *flags) as sim:

        async def run(n: int) -> list[float]:
            prompts = [[(i * 7919 + j) % 30000 + 1 for j in range(500)] for i in range(n)]
            return await asyncio.gather(*(_ttft(sim.url, p) for p in prompts))

        alone = asyncio.run(run(1))[0]
        together = asyncio.run(run(8))
    cost = 500 * 400e-6  # 0.2 s of simulated prefill per prompt; never faster than that
    assert alone >= cost
    assert sorted(together)[-1] >= 7 * cost  # the last of 8 waits for the others' prefill
    assert sum(together) / 8 >= 3.5 * cost


def test_client_disconnect_frees_the_engine(tmp_path: Path) -> None:
    with sim_server(tmp_path, "--decode-step-ms", "20") as sim:

        async def read_some_then_leave() -> int:
            async with aiohttp.ClientSession() as s:
                body = {"prompt": [1, 2, 3], "max_tokens": 1000, "stream": True, "ignore_eos": True}
                async with s.post(f"{sim.url}/v1/completions", json=body) as r:
                    n = 0
                    async for line in r.content:
                        n += line.startswith(b"data: {")
                        if n == 5:
                            return n
            return n

        assert asyncio.run(read_some_then_leave()) == 5
        deadline = time.monotonic() + 3
        running = 1.0
        while time.monotonic() < deadline:
            running = metric(get(f"{sim.url}/metrics"), "vllm:num_requests_running")
            if running == 0:
                break
            time.sleep(0.05)
        assert running == 0
        generated = metric(get(f"{sim.url}/metrics"), "vllm:generation_tokens_total")
        assert generated < 100  # it stopped long before 1000 tokens


def test_calibrate_recovers_a_known_profile(tmp_path: Path) -> None:
    """Calibrate against a simulator whose costs are known: the fit must find them again."""
    from ucmctl.sim.calibrate import calibrate

    # Costs well above scheduling noise, so the fit is judged, not the machine's load.
    flags = ["--prefill-us-per-token", "500", "--decode-step-ms", "25", "--block-size", str(BLOCK)]
    with sim_server(tmp_path, *flags) as sim:
        profile = calibrate(sim.url, tmp_path / "p.json", lengths=[256, 512, 1024], batches=[1, 4],
                            vocab=30000, kv_bytes_per_token=2048, name="t")  # fmt: skip
    assert profile.prefill_ms(1024, 0) == pytest.approx(1024 * 0.5, rel=0.25)
    assert profile.decode_ms(1, 0) == pytest.approx(25, rel=0.25)
    assert profile.decode_ms(4, 0) == pytest.approx(25, rel=0.25)
    saved = json.loads((tmp_path / "p.json").read_text())
    assert saved["name"] == "t" and len(saved["points"]["prefill"]) == 9
