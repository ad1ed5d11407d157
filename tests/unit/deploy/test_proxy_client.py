"""What `status` says of the proxy's routing, from its spec and its GET /routing."""

from __future__ import annotations

import http.server
import json
import threading
from collections.abc import Iterator

import pytest

from ucmctl.deploy.proxy_client import routing_line
from ucmctl.plan.model import Process
from ucmctl.plan.proxy_spec import ProxySpec

KV = {
    "policy": "kv",
    "index": "approximate (the proxy's routing history)",
    "blocks": 1234,
    "block_size": 16,
    "prefill": {"seconds_per_token": 0.000366, "measured": True, "samples": 12},
    "load": {"seconds_per_token": 0.0000366, "measured": False, "samples": 0},
}


@pytest.fixture
def answering() -> Iterator[tuple[str, dict]]:
    said: dict = {}

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = json.dumps(said).encode()
            self.send_response(200 if self.path == "/routing" else 404)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", said
    finally:
        server.shutdown()


def proxy_process(url: str, **spec: object) -> Process:
    fields = {"python": "python3", "host": "127.0.0.1", "port": 1, "mode": "pd", **spec}
    return Process.model_construct(
        name="proxy", role="proxy", url=url, proxy=ProxySpec.model_validate(fields)
    )


def test_kv_says_its_index_and_speeds(answering: tuple[str, dict]) -> None:
    url, said = answering
    said.update(KV)
    line = routing_line(proxy_process(url, routing="kv", direct_below=256, roles="dynamic"))
    assert line == (
        "proxy routing: kv, roles per request, straight to decode below 256 tokens to compute; "
        "index: approximate (the proxy's routing history), 1234 blocks; prefill 0.366 ms/token, "
        "measured (12 legs); load 0.0366 ms/token, prior"
    )


def test_kv_says_what_its_event_feeds_read(answering: tuple[str, dict]) -> None:
    url, said = answering
    feeds = [{"url": "a", "batches": 9, "events": 40, "gaps": 1, "bad": 0},
             {"url": "b", "batches": 1, "events": 2, "gaps": 0, "bad": 3},
             {"url": "c", "batches": 0, "events": 0, "gaps": 0, "bad": 0}]  # fmt: skip
    said.update({**KV, "index": "vLLM KV events of 2 instances, with the proxy's routing history",
                 "kv_events": feeds})  # fmt: skip
    line = routing_line(proxy_process(url, routing="kv"))
    assert line is not None and line.startswith(
        "proxy routing: kv; index: vLLM KV events of 2 instances, with the proxy's routing history, "
        "1234 blocks (42 events read, 1 batches missed, 3 malformed, 1 of 3 servers not heard from); "
        "prefill 0.366 ms/token"
    ), line


def test_another_policy_is_one_word_and_a_silent_proxy_says_nothing(answering: tuple[str, dict]) -> None:
    url, said = answering
    said.update({"policy": "least-loaded"})
    assert routing_line(proxy_process(url)) == "proxy routing: least-loaded"
    assert (
        routing_line(proxy_process(url, migrations=0))
        == "proxy routing: least-loaded, cut answers end (migrations 0)"
    )
    assert (
        routing_line(proxy_process(url, migrations=5))
        == "proxy routing: least-loaded, a cut answer moves 5x at most"
    )
    assert (
        routing_line(proxy_process(url, stall_timeout=5))
        == "proxy routing: least-loaded, a server silent 5 s is out"
    )
    assert routing_line(proxy_process(url, stall_timeout=0)) == "proxy routing: least-loaded, no stall watch"
    assert routing_line(proxy_process("http://127.0.0.1:9")) is None  # nothing listens there


def test_kv_says_where_text_prompts_token_ids_come_from(answering: tuple[str, dict]) -> None:
    url, said = answering
    said.update({**KV, "tokenization": {"source": "exact (/tokenize)", "exact": 3, "refused": 0}})
    line = routing_line(proxy_process(url, routing="kv"))
    assert line is not None and line.endswith("; text prompts' tokens: exact (/tokenize)"), line
