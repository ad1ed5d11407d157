"""Health gates: what a probe reports, and the reason a gate gives when time runs out."""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from ucmctl.deploy.health import wait_healthy, why_not


@contextlib.contextmanager
def answering(status: int) -> Iterator[str]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(status)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/health"
    finally:
        server.shutdown()
        server.server_close()


@contextlib.contextmanager
def silent() -> Iterator[str]:
    """A port that accepts connections and never answers (as a hung server would)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(16)
        yield f"http://127.0.0.1:{s.getsockname()[1]}/health"


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_probe_reports_why_a_url_is_not_healthy() -> None:
    with answering(200) as url:
        assert why_not(url) is None
    with answering(503) as url:
        assert why_not(url) == "HTTP 503"
    assert why_not(f"http://127.0.0.1:{closed_port()}/health") == "connection refused"
    with silent() as url:
        assert why_not(url, timeout=0.3) == "timed out"
    assert why_not("http://no-such-host.invalid:1/health") == "name not resolved"


def test_a_gate_that_times_out_names_the_last_reason() -> None:
    with answering(503) as url:
        reason = wait_healthy([url], timeout=0.3, still_alive=lambda: True, interval=0.05)
    assert reason is not None
    assert reason.startswith(f"{url} did not answer 200 within 0 s (last try from this machine: HTTP 503)")
    assert "reach" not in reason  # the server answered: the network is fine


def test_a_gate_that_never_connects_points_at_the_network() -> None:
    with silent() as url:
        reason = wait_healthy([url], timeout=2.5, still_alive=lambda: True, interval=0.05)
    assert reason is not None and "last try from this machine: timed out" in reason
    port = url.split(":")[2].split("/")[0]
    assert f"check that this machine can reach 127.0.0.1 port {port}" in reason


@pytest.mark.parametrize("alive", [True, False])
def test_a_gate_passes_when_every_url_answers_in_order_or_stops_when_the_process_dies(alive: bool) -> None:
    with answering(200) as ok:
        assert wait_healthy([ok, ok], timeout=5, still_alive=lambda: alive) is None
    refused = f"http://127.0.0.1:{closed_port()}/health"
    reason = wait_healthy([refused], timeout=0.5 if alive else 30, still_alive=lambda: alive,
                          interval=0.05, alive_every=0.1)  # fmt: skip
    if alive:
        assert reason is not None and "connection refused" in reason and "reach" not in reason
    else:
        assert reason == "the process exited before it became healthy"


def test_health_is_a_value_and_its_words_are_for_display() -> None:
    from ucmctl.deploy.health import HEALTHY, NOT_ASKED, UNKNOWN, Health, HealthKind

    assert Health.of(None) == HEALTHY and HEALTHY.words() == "healthy" and not HEALTHY.unhealthy
    refused = Health.of("connection refused")
    assert refused.kind is HealthKind.unhealthy and refused.unhealthy and not refused.answered
    assert refused.words() == "unhealthy (connection refused)"
    said_no = Health.of("HTTP 503")
    assert said_no.unhealthy and said_no.answered  # it runs and answers: an upstream is down
    assert (NOT_ASKED.words(), UNKNOWN.words()) == ("-", "?")
    assert not NOT_ASKED.unhealthy and not UNKNOWN.unhealthy
