"""`kv` routing reads each instance's KV-cache events (vLLM's schema and transport: the publisher
binds a ZMQ PUB socket, the proxy's SUB connects; multipart topic, 8-byte sequence number,
msgpack batch): a prefix goes to the instance whose events say it holds it, and no longer once
its events say it evicted it, even where the proxy's own routing history says otherwise; a
missed batch and a malformed one are counted, and requests are served throughout: first from the
test's own sockets, writing what vLLM writes, then from simulators publishing their own."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path

import msgspec
import pytest
import zmq

from tests.support.processes import free_port, wait_for

from .procs import Proc, completion, get, metric, post, proxy, sim

Launch = Callable[..., list[Proc]]
SHARED = [(n * 7) % 5000 + 10 for n in range(640)]  # 40 blocks of 16
HASHES = [n.to_bytes(4, "big") * 8 for n in range(40)]  # vLLM 0.32's block hashes are 32 bytes


def batch(*events: dict) -> bytes:
    return msgspec.msgpack.encode([1.5, list(events), 0])


def stored(hashes: list[bytes], ids: list[int]) -> dict:
    return {"type": "BlockStored", "block_hashes": hashes, "parent_block_hash": None, "token_ids": ids,
            "block_size": 16, "lora_id": None, "medium": "GPU", "lora_name": None}  # fmt: skip


class Publisher:
    """One instance's event publisher: binds, as vLLM's engine does, and numbers its batches."""

    def __init__(self, ctx: zmq.Context) -> None:
        self.sock = ctx.socket(zmq.PUB)
        self.port = self.sock.bind_to_random_port("tcp://127.0.0.1")
        self.seq = 0

    def send(self, payload: bytes, skip: int = 0) -> None:
        self.seq += 1 + skip
        self.sock.send_multipart([b"kv@sim", self.seq.to_bytes(8, "big"), payload])


@pytest.fixture
def publishers() -> Iterator[list[Publisher]]:
    ctx = zmq.Context()
    pubs = [Publisher(ctx) for _ in range(3)]
    yield pubs
    for p in pubs:
        p.sock.close(linger=0)
    ctx.term()


def test_kv_routing_follows_each_instances_kv_events(
    launch: Launch, tmp_path: Path, publishers: list[Publisher]
) -> None:
    mixed = [sim(tmp_path, "--block-size", "16") for _ in range(3)]
    flags = ["--mode", "mixed", "--routing", "kv", "--block-size", "16", "--served-model", "sim-model"]
    for m, pub in zip(mixed, publishers, strict=True):
        flags += ["--instance", m.url, "--kv-events", f"{m.url}=tcp://127.0.0.1:{pub.port}"]
    px = proxy(tmp_path, *flags)
    launch(*mixed, px)

    def feeds() -> list[dict]:
        by_url = {f["url"]: f for f in json.loads(get(px.url + "/routing")[2])["kv_events"]}
        return [by_url[m.url] for m in mixed]

    def served() -> list[float]:
        return [metric(m.url, "vllm:request_success_total", absent=0.0) for m in mixed]

    def send(i: int, *events: dict) -> None:
        """Publish one batch to instance i and wait until the proxy applied it."""
        before = feeds()[i]["events"]
        publishers[i].send(batch(*events))
        assert wait_for(lambda: feeds()[i]["events"] >= before + len(events), 10), f"instance {i}'s events"

    for i, pub in enumerate(publishers):  # until each SUB has joined (a PUB drops what no one reads)
        assert wait_for(lambda i=i, pub=pub: pub.send(batch()) or feeds()[i]["batches"] >= 1, 10), i
    routing = json.loads(get(px.url + "/routing")[2])
    assert routing["index"].startswith("vLLM KV events of 3 instances"), routing

    url = px.url + "/v1/completions"
    send(2, stored(HASHES, SHARED))  # instance 2's cache holds the 40 blocks
    before = served()
    assert post(url, completion(2, prompt=[*SHARED, 7000]))[0] == 200
    assert [int(a - b) for a, b in zip(served(), before, strict=True)] == [0, 0, 1]

    # 2 evicted them (its own routing history still says it computed them), 0 holds them now
    send(2, {"type": "BlockRemoved", "block_hashes": HASHES, "medium": "GPU"})
    send(0, stored(HASHES, SHARED))
    before = served()
    for n in range(3):
        assert post(url, completion(2, prompt=[*SHARED, 7001 + n]))[0] == 200
    assert [int(a - b) for a, b in zip(served(), before, strict=True)] == [3, 0, 0]

    # a batch missed on 1 and a malformed one: counted; requests still served
    publishers[1].send(batch(), skip=1)
    publishers[1].send(b"\xc1")
    assert wait_for(lambda: feeds()[1]["bad"] == 1, 10), feeds()[1]
    assert feeds()[1]["gaps"] == 1
    assert post(url, completion(2, prompt=[5] * 40))[0] == 200
    for i, outcome, value in ((2, "applied", 2), (0, "applied", 1), (1, "gap", 1), (1, "bad", 1)):
        got = metric(px.url, "ucmctl_proxy_kv_events_total", instance=mixed[i].url, outcome=outcome)
        assert got == value, (i, outcome, got)


def test_kv_routing_reads_the_simulators_own_events(launch: Launch, tmp_path: Path) -> None:
    """Simulators publishing their prefix caches' events (as vLLM does; 128 blocks of KV each):
    a prompt sent to one of them directly, which the proxy never routed, is routed there; once
    that one evicted it, and another holds it, to the other."""
    ports = [free_port(), free_port()]
    small = ["--block-size", "16", "--kv-bytes-per-token", "1024", "--kv-cache-gib", str(2**-9)]  # 128 blocks
    events = [{"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": f"tcp://*:{p}"} for p in ports]
    mixed = [sim(tmp_path, *small, "--kv-events-config", json.dumps(e)) for e in events]
    flags = ["--mode", "mixed", "--routing", "kv", "--block-size", "16", "--served-model", "sim-model"]
    for m, port in zip(mixed, ports, strict=True):
        flags += ["--instance", m.url, "--kv-events", f"{m.url}=tcp://127.0.0.1:{port}"]
    px = proxy(tmp_path, *flags)
    launch(*mixed, px)

    def applied(i: int) -> int:
        return int(metric(px.url, "ucmctl_proxy_kv_events_total", instance=mixed[i].url, outcome="applied"))

    def direct(i: int, prompt: list[int]) -> None:
        """A request to instance i itself, then its events read by the proxy."""
        before = applied(i)
        assert post(mixed[i].url + "/v1/completions", completion(1, prompt=prompt))[0] == 200
        assert wait_for(lambda: applied(i) > before, 10), f"no event of instance {i} read"

    # each SUB joins its publisher in the background: a first request's events may go unread
    tries = iter(range(10_000))
    for i in (0, 1):
        assert wait_for(lambda i=i: one_block(mixed[i], next(tries)) or applied(i) > 0, 15, every=0.2), i
    other = [[(n * 11 + k) % 5000 + 10 for n in range(640)] for k in range(2)]  # 40 blocks each
    direct(1, SHARED)  # instance 1 holds SHARED, unknown to the proxy's routing history
    assert took(px, mixed, [*SHARED, 9]) == [0, 1]
    # instance 1 evicts it (two other prompts of 40 blocks: a request holds its 41 blocks while
    # it runs, the cache keeps the 87 left), 0 holds it: routed there, where the proxy's own
    # history says 1
    for prompt in other:
        direct(1, prompt)
    direct(0, SHARED)
    assert took(px, mixed, [*SHARED, 10]) == [1, 0]


def one_block(instance: Proc, n: int) -> None:
    """A request of one new block straight to an instance (its events: that block stored)."""
    assert post(instance.url + "/v1/completions", completion(1, prompt=[100 + n] * 20))[0] == 200


def took(px: Proc, instances: list[Proc], prompt: list[int]) -> list[int]:
    """A request through the proxy: how many requests each instance served meanwhile."""
    before = [metric(m.url, "vllm:request_success_total") for m in instances]
    assert post(px.url + "/v1/completions", completion(2, prompt=prompt))[0] == 200
    after = [metric(m.url, "vllm:request_success_total") for m in instances]
    return [int(a - b) for a, b in zip(after, before, strict=True)]


def test_a_chat_meets_the_events_through_tokenize_and_its_hits_are_predicted(
    launch: Launch, tmp_path: Path
) -> None:
    """A chat is text: the proxy asks an instance's /tokenize for its token ids, so its blocks
    are the ones the events name, and the conversation an instance holds (known from its events
    only) goes back there; a proxy that estimates from the text (--no-tokenize) cannot know it.
    The local hits the proxy expected are the ones the instance counted."""
    ports = [free_port(), free_port()]
    events = [{"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": f"tcp://*:{p}"} for p in ports]
    mixed = [sim(tmp_path, "--block-size", "16", "--kv-events-config", json.dumps(e)) for e in events]
    flags = ["--mode", "mixed", "--routing", "kv", "--block-size", "16", "--served-model", "sim-model"]
    for m, port in zip(mixed, ports, strict=True):
        flags += ["--instance", m.url, "--kv-events", f"{m.url}=tcp://127.0.0.1:{port}"]
    exact, estimating = proxy(tmp_path, *flags), proxy(tmp_path, *flags, "--no-tokenize")
    launch(*mixed, exact, estimating)

    def applied(px: Proc, i: int) -> int:
        return int(metric(px.url, "ucmctl_proxy_kv_events_total", instance=mixed[i].url, outcome="applied"))

    tries = iter(range(10_000))
    for px in (exact, estimating):
        for i in (0, 1):
            assert wait_for(
                lambda i=i, px=px: one_block(mixed[i], next(tries)) or applied(px, i) > 0, 15, every=0.2
            )
    words = " ".join(f"w{(n * 13) % 997}" for n in range(700))  # ~44 blocks of the sim's word tokens
    first = [{"role": "user", "content": words}]
    before = [applied(px, 1) for px in (exact, estimating)]
    status, _, raw = post(mixed[1].url + "/v1/chat/completions", chat(first))  # instance 1 alone holds it
    assert status == 200, raw
    answer = json.loads(raw)["choices"][0]["message"]["content"]
    for px, was in zip((exact, estimating), before, strict=True):
        assert wait_for(lambda px=px, was=was: applied(px, 1) > was, 10)
    second = [*first, {"role": "assistant", "content": answer}, {"role": "user", "content": "and then?"}]

    def through(px: Proc) -> list[int]:
        served = [metric(m.url, "vllm:request_success_total") for m in mixed]
        status, _, raw = post(px.url + "/v1/chat/completions", chat(second))
        assert status == 200, raw
        return [
            int(metric(m.url, "vllm:request_success_total") - s) for m, s in zip(mixed, served, strict=True)
        ]

    hits = metric(mixed[1].url, "vllm:prefix_cache_hits_total")
    assert through(exact) == [0, 1]  # the exact ids meet instance 1's events
    counted = metric(mixed[1].url, "vllm:prefix_cache_hits_total") - hits
    assert through(estimating) == [1, 0]  # the text's estimate meets no event: by load, the first
    routing = json.loads(get(exact.url + "/routing")[2])
    assert routing["tokenization"] == {"source": "exact (/tokenize)", "exact": 1, "refused": 0, "failed": 0,
                                       "no_endpoint": 0}  # fmt: skip
    predicted = routing["predicted"][mixed[1].url]
    assert counted >= 40 * 16 and predicted["local"] == counted, (predicted, counted)
    assert predicted["external"] == 0 and predicted["legs"] == 1
    assert json.loads(get(estimating.url + "/routing")[2])["tokenization"] == {
        "source": "estimated (--no-tokenize)"
    }


def chat(messages: list[dict]) -> dict:
    return {"model": "sim-model", "messages": messages, "max_tokens": 4, "temperature": 0}
