"""What the proxy's benchmarks share: a proxy process on a free loopback port, and the tiny model
with one UCM store for the instances behind it."""

from __future__ import annotations

import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from tests.support.processes import free_port
from tests.support.vllm_server import write_ucm_config


def start_proxy(flags: list[str], log: Path, timeout: float = 30) -> tuple[subprocess.Popen[bytes], str]:
    """`python -m ucmctl.proxy FLAGS` on a free loopback port, once it answers /health: the
    process (its own session: the caller kills it) and its URL."""
    port = free_port()
    argv = [sys.executable, "-m", "ucmctl.proxy", "--host", "127.0.0.1", "--port", str(port), *flags]
    with log.open("wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if urllib.request.urlopen(url + "/health", timeout=1).status == 200:
                return proc, url
        except OSError:
            time.sleep(0.1)
    proc.kill()
    proc.wait()
    raise RuntimeError(f"the proxy did not answer: {log.read_text()[-2000:]}")


def model_and_store(tmp: Path) -> tuple[Path, Path]:
    """The tiny model (its tokenizer makes the benchmarks' prompts) and the UCM config of one
    store under `tmp` (`Cache|Posix`, a DRAM tier of 0.5 GB)."""
    from ucmctl.tinymodel import make_model

    model = make_model(tmp / "tiny", size="tiny", seed=0)
    store = tmp / "store"
    store.mkdir()
    return model, write_ucm_config(tmp / "ucm.yaml", store, cache_gb=0.5)
