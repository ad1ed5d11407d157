"""Network endpoints as their consumers spell them."""

from __future__ import annotations


def tcp_url(host: str, port: int) -> str:
    """`tcp://HOST:PORT` as ZMQ takes it, an IPv6 address in brackets."""
    return f"tcp://[{host}]:{port}" if ":" in host else f"tcp://{host}:{port}"
