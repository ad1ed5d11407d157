"""The proxy's routing policies against running simulator instances: `session` keeps a
conversation on one instance (the `user` field, or the `X-Session-Id` header over it) and spreads
conversations; `round-robin` turns whatever the load; `kv` sends a prefix back to the instance
that holds it (its local prefix cache hits) and says what it knows at /routing."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path

import aiohttp

from .procs import Proc, completion, get, metric, pd_flags, post, proxy, sim

Launch = Callable[..., list[Proc]]


def served(instances: list[Proc]) -> list[float]:
    return [metric(m.url, "vllm:request_success_total", absent=0.0) for m in instances]


def delta(before: list[float], after: list[float]) -> list[int]:
    return [int(a - b) for a, b in zip(after, before, strict=True)]


def test_session_keeps_each_conversation_on_one_instance(launch: Launch, tmp_path: Path) -> None:
    mixed = [sim(tmp_path) for _ in range(3)]
    flags = [f for m in mixed for f in ("--instance", m.url)]
    px = proxy(tmp_path, "--mode", "mixed", *flags, "--routing", "session")
    launch(*mixed, px)
    assert "routing session" in px.log.read_text()
    url = px.url + "/v1/completions"
    homes: dict[str, int] = {}
    for user in ("ana", "bo", "cy", "di", "ed", "flo"):
        before = served(mixed)
        for turn in range(4):  # each turn a different prompt, as a conversation's are
            body = {**completion(2, prompt=[turn + 1] * (50 + turn)), "user": user}
            assert post(url, body)[0] == 200
        moved = delta(before, served(mixed))
        assert sorted(moved) == [0, 0, 4], (user, moved)  # every turn on one instance
        homes[user] = moved.index(4)
    assert len(set(homes.values())) >= 2, homes  # conversations spread
    # the header names the conversation over the body's user
    before = served(mixed)
    for turn in range(3):
        body = {**completion(2, prompt=[7] * 40), "user": f"someone-{turn}"}
        assert post(url, body, headers={"X-Session-Id": "ana"})[0] == 200
    assert delta(before, served(mixed))[homes["ana"]] == 3


def test_round_robin_turns_whatever_the_load(launch: Launch, tmp_path: Path) -> None:
    prefill, decode = [sim(tmp_path)], [sim(tmp_path), sim(tmp_path)]
    px = proxy(tmp_path, *pd_flags(prefill, decode), "--routing", "round-robin")
    launch(*prefill, *decode, px)
    before = served(decode)
    for i in range(6):
        assert post(px.url + "/v1/completions", completion(2, prompt=[i + 1] * 30))[0] == 200
    assert delta(before, served(decode)) == [3, 3]


def test_kv_sends_a_prefix_back_to_the_instance_that_holds_it(launch: Launch, tmp_path: Path) -> None:
    mixed = [sim(tmp_path, "--block-size", "16") for _ in range(3)]
    flags = [f for m in mixed for f in ("--instance", m.url)]
    px = proxy(tmp_path, "--mode", "mixed", *flags, "--routing", "kv", "--block-size", "16")
    launch(*mixed, px)
    url = px.url + "/v1/completions"
    shared = [(n * 7) % 5000 + 10 for n in range(640)]  # 40 blocks
    before = served(mixed)
    assert post(url, completion(2, prompt=shared))[0] == 200
    home = delta(before, served(mixed)).index(1)
    hits = metric(mixed[home].url, "vllm:prefix_cache_hits_total", absent=0.0)
    for n in range(4):  # the same 40 blocks and a tail: to the instance that holds them
        assert post(url, completion(2, prompt=[*shared, 7000 + n]))[0] == 200
    assert delta(before, served(mixed))[home] == 5
    assert metric(mixed[home].url, "vllm:prefix_cache_hits_total") - hits >= 4 * 640  # local hits, really
    for n in range(6):  # new prompts go by load: they spread
        assert post(url, completion(2, prompt=[8000 + n] * 100))[0] == 200
    assert all(d >= 1 for d in delta(before, served(mixed)))
    status, _, raw = get(px.url + "/routing")
    described = json.loads(raw)
    assert status == 200 and described["policy"] == "kv" and described["block_size"] == 16
    assert described["index"].startswith("approximate") and described["blocks"] >= 40 + 4 * 6
    assert described["prefill"]["measured"] is True and described["prefill"]["samples"] >= 1
    index = described["index"]
    assert metric(px.url, "ucmctl_proxy_routing_info", policy="kv", index=index) == 1
    assert metric(px.url, "ucmctl_proxy_kv_index_blocks") == described["blocks"]


def test_a_request_mostly_cached_goes_to_a_decode_instance_alone(launch: Launch, tmp_path: Path) -> None:
    prefill, decode = [sim(tmp_path)], [sim(tmp_path), sim(tmp_path)]
    flags = ["--routing", "kv", "--block-size", "16", "--direct-below", "200"]
    px = proxy(tmp_path, *pd_flags(prefill, decode), *flags)
    launch(*prefill, *decode, px)
    url = px.url + "/v1/completions"
    long = [(n * 11) % 5000 + 10 for n in range(640)]

    def paths() -> tuple[float, float]:
        return tuple(  # type: ignore[return-value]
            metric(px.url, "ucmctl_proxy_requests_by_path_total", absent=0.0, path=p)
            for p in ("disaggregated", "direct")
        )

    p0, d0 = served(prefill), served(decode)
    assert post(url, completion(2, prompt=[5] * 100))[0] == 200  # 100 tokens to compute: direct
    assert paths() == (0, 1) and delta(p0, served(prefill)) == [0] and sum(delta(d0, served(decode))) == 1
    assert post(url, completion(2, prompt=long))[0] == 200  # 640 fresh tokens: prefill first
    assert paths() == (1, 1) and delta(p0, served(prefill)) == [1]
    # the same 640 and 20 more: the store has the 640 (prefill saved them), 20 to compute
    assert post(url, completion(2, True, [*long, *range(20)]))[0] == 200
    assert paths() == (1, 2) and delta(p0, served(prefill)) == [1]
    assert sum(delta(d0, served(decode))) == 3


def test_dynamic_roles_give_each_request_whole_to_the_least_loaded_instance_of_either_side(
    launch: Launch, tmp_path: Path
) -> None:
    # each prompt token 2 ms to compute: a prompt of 400 keeps its instance busy for 0.8 s
    prefill = [sim(tmp_path, "--prefill-us-per-token", "2000")]
    decode = [sim(tmp_path, "--prefill-us-per-token", "2000") for _ in range(2)]
    px = proxy(tmp_path, *pd_flags(prefill, decode), "--roles", "dynamic")
    launch(*prefill, *decode, px)
    everyone = [*prefill, *decode]
    url = px.url + "/v1/completions"

    def paths() -> tuple[int, int]:
        return tuple(  # type: ignore[return-value]
            int(metric(px.url, "ucmctl_proxy_requests_by_path_total", absent=0.0, path=p))
            for p in ("disaggregated", "direct")
        )

    before = served(everyone)
    for n in range(6):  # one at a time: each finds every instance idle and goes whole to one (in turn)
        assert post(url, completion(2, prompt=[n + 1] * 400))[0] == 200
    took = delta(before, served(everyone))
    assert took == [2, 2, 2] and paths() == (0, 6), (took, paths())  # one leg each, spread over all

    async def four_at_once() -> list[int]:
        async with aiohttp.ClientSession() as s:

            async def one(n: int) -> int:
                async with s.post(url, json=completion(2, prompt=[n + 50] * 400)) as r:
                    await r.read()
                    return r.status

            return list(await asyncio.gather(*(one(n) for n in range(4))))

    before = served(everyone)
    assert asyncio.run(four_at_once()) == [200] * 4
    # three went whole, one to each free instance; the fourth found all three computing a prompt
    # and went whole too, to wait behind one of them (no prefill leg of its own anywhere)
    took = delta(before, served(everyone))
    assert paths() == (0, 10) and sorted(took) == [1, 1, 2], (paths(), took)
