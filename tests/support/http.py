"""Small HTTP helpers for tests that talk to a server the way a client does."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

from aiohttp import web


def post(url: str, body: Any, raw: bool = False, timeout: float = 120) -> tuple[int, Any]:
    """POST JSON (or bytes as they are); returns (status, decoded JSON or raw bytes), 4xx/5xx included."""
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            payload = r.read()
            return r.status, payload if raw else json.loads(payload)
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as r:
        return r.read().decode()


def completion(url: str, prompt: list[int], max_tokens: int = 4) -> dict:
    """One /v1/completions of the simulator's model, its JSON answer."""
    body = json.dumps({"model": "sim-model", "prompt": prompt, "max_tokens": max_tokens}).encode()
    req = urllib.request.Request(
        f"{url}/v1/completions", data=body, headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.loads(r.read())


def metrics(url: str) -> str:
    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as r:
        return r.read().decode()


async def serve(app: web.Application) -> tuple[str, web.AppRunner]:
    """`app` on a free loopback port: its base URL, and its runner (`cleanup()` stops it)."""
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    return f"http://127.0.0.1:{runner.addresses[0][1]}", runner
