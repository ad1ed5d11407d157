"""Simulator instances and proxies as real processes on free loopback ports, and small HTTP helpers."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
from multidict import CIMultiDict

from tests.support.processes import free_port

HOST = "127.0.0.1"
REPO = Path(__file__).resolve().parents[3]


@dataclass
class Proc:
    """One started process (its own process group) and the URL it serves."""

    argv: list[str]
    port: int
    log: Path
    env: dict[str, str] | None = None
    popen: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    def start(self) -> Proc:
        env = {**os.environ, **(self.env or {})}
        with open(self.log, "wb") as out:
            self.popen = subprocess.Popen(
                self.argv, stdout=out, stderr=subprocess.STDOUT, cwd=REPO, env=env, start_new_session=True
            )
        return self

    def kill(self, sig: int = signal.SIGKILL) -> None:
        """Signal the process group; wait for it to be gone."""
        if self.popen is None or self.popen.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.popen.pid, sig)
        try:
            self.popen.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(self.popen.pid, signal.SIGKILL)
            self.popen.wait()

    def send(self, sig: int) -> None:
        """Signal the process group, not waiting for anything (SIGSTOP, SIGCONT)."""
        assert self.popen is not None and self.popen.poll() is None
        os.killpg(self.popen.pid, sig)

    def wait_ready(self, path: str = "/health", timeout: float = 30.0) -> None:
        """Until `path` answers 200 (the process is up and serving)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.popen is not None and self.popen.poll() is not None:
                raise RuntimeError(
                    f"{self.argv[:4]} exited {self.popen.returncode}: {self.log.read_text()[-2000:]}"
                )
            with contextlib.suppress(OSError):
                status, _, _ = get(self.url + path, timeout=1.0)
                if status == 200:
                    return
            time.sleep(0.05)
        raise TimeoutError(f"{self.url}{path} not ready after {timeout} s: {self.log.read_text()[-2000:]}")


def sim(tmp: Path, *flags: str) -> Proc:
    """A zero-cost simulator instance (not started)."""
    port = free_port()
    argv = [sys.executable, "-m", "ucmctl", "sim", "serve", "sim-model", "--host", HOST, "--port", str(port),
            "--profile", "zero", *flags]  # fmt: skip
    return Proc(argv, port, tmp / f"sim-{port}.log")


def proxy(tmp: Path, *flags: str, env: dict[str, str] | None = None) -> Proc:
    """A proxy process (not started), checking health often so tests do not wait long."""
    port = free_port()
    argv = [sys.executable, "-m", "ucmctl.proxy", "--host", HOST, "--port", str(port),
            "--health-interval", "0.3", "--health-timeout", "1", *flags]  # fmt: skip
    return Proc(argv, port, tmp / f"proxy-{port}.log", env=env)


def pd_flags(prefill: Iterable[Proc], decode: Iterable[Proc]) -> list[str]:
    """--prefiller/--decoder flags for these instances."""
    out: list[str] = ["--mode", "pd"]
    for p in prefill:
        out += ["--prefiller", p.url]
    for d in decode:
        out += ["--decoder", d.url]
    return out


def start_all(*procs: Proc, proxies_ready: str = "/health") -> None:
    """Start everything at once (imports take most of the time), then wait for each."""
    for p in procs:
        p.start()
    for p in procs:
        p.wait_ready("/health" if "sim" in p.argv else proxies_ready)
    started = {p.url for p in procs if "sim" in p.argv}
    for p in procs:
        if "sim" not in p.argv and proxies_ready == "/health":
            # a proxy that checked before an instance listened has it out of routing for one more interval
            want = started & _given(p)
            wait_for(lambda p=p, want=want: _in_routing(p) >= want, 10, f"{p.url}: its instances in routing")


def _given(p: Proc) -> set[str]:
    flags = ("--instance", "--prefiller", "--decoder")
    return {p.argv[k + 1] for k, a in enumerate(p.argv[:-1]) if a in flags}


def _in_routing(p: Proc) -> set[str]:
    status, _, raw = get(p.url + "/health")
    return {i["url"] for i in json.loads(raw)["instances"] if i["healthy"]} if status in (200, 503) else set()


# --- HTTP -------------------------------------------------------------------------------------


async def _request(
    method: str, url: str, body: Any = None, headers: dict[str, str] | None = None, timeout: float = 30.0
) -> tuple[int, dict[str, str], bytes]:
    data = body if isinstance(body, bytes) or body is None else json.dumps(body).encode()
    hdrs = {"Content-Type": "application/json", **(headers or {})}
    async with (
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout)) as s,
        s.request(method, url, data=data, headers=hdrs) as r,
    ):
        return r.status, CIMultiDict(r.headers), await r.read()  # type: ignore[return-value]


def get(url: str, timeout: float = 30.0) -> tuple[int, dict[str, str], bytes]:
    """GET `url`: status, headers, body."""
    return asyncio.run(_request("GET", url, timeout=timeout))


def post(
    url: str, body: Any = None, headers: dict[str, str] | None = None, timeout: float = 30.0
) -> tuple[int, dict[str, str], bytes]:
    """POST JSON (or bytes) to `url`: status, headers, body."""
    return asyncio.run(_request("POST", url, body, headers, timeout))


def completion(
    tokens: int = 8, stream: bool = False, prompt: Any = "hello there general kenobi"
) -> dict[str, Any]:
    """A completion request body."""
    return {
        "model": "sim-model",
        "prompt": prompt,
        "max_tokens": tokens,
        "stream": stream,
        "ignore_eos": True,
    }


def sse_events(raw: bytes) -> list[str]:
    """The data: payloads of an SSE body."""
    return [e[len("data: ") :] for e in raw.decode().split("\n\n") if e.startswith("data: ")]


_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)$")


def metric(url: str, name: str, *, absent: float | None = None, **labels: str) -> float:
    """The sum of a Prometheus metric's samples at `url`/metrics whose labels match (`absent`
    when there is none and that is given: a counter with no sample yet)."""
    _, _, text = get(url + "/metrics")
    total, found = 0.0, False
    for line in text.decode().splitlines():
        m = _SAMPLE.match(line)
        if not m or m.group(1) != name:
            continue
        got = dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', m.group(2) or ""))
        if all(got.get(k) == v for k, v in labels.items()):
            total += float(m.group(3))
            found = True
    if not found and absent is not None:
        return absent
    if not found:
        raise KeyError(f"{name}{labels} not in {url}/metrics")
    return total


def wait_for(predicate: Any, timeout: float, what: str) -> None:
    """Poll `predicate` until true or fail with `what`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError(f"not within {timeout} s: {what}")
