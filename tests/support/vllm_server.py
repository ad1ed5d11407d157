"""Start and stop real `vllm serve` processes on the CPU for end-to-end tests and benchmarks.

Each server gets a free port chosen at run time, its own short TMPDIR (vLLM leaves ZMQ
sockets and dist files there after SIGTERM; the whole folder is removed at stop), and its own
process group, so stop() kills the API server, the engine core and the worker together.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from tests.support.processes import free_port
from ucmctl.core.ucm_config import parse_ucm_config

VENV_BIN = Path(sys.executable).parent
HASH_SEED = "0"
EAGER_ENV = {"TORCHDYNAMO_DISABLE": "1"}  # with --enforce-eager: see VllmServer.eager
IN_PROCESS_WORKER_ENV = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}  # with uni: see VllmServer.in_process_worker


def write_ucm_config(
    path: Path,
    storage: Path,
    pipeline: str = "Cache|Posix",
    cache_gb: float = 0.5,
    layerwise: bool = False,
    pack_blocks: int = 1,
) -> Path:
    # Same shape as the Plan's rendered file; a small DRAM tier so two servers fit here.
    path.write_text(
        "ucm_connectors:\n"
        '  - ucm_connector_name: "UcmPipelineStore"\n'
        "    ucm_connector_config:\n"
        f'      store_pipeline: "{pipeline}"\n'
        f'      storage_backends: "{storage}"\n'
        f"      cache_buffer_capacity_gb: {cache_gb}\n"
        "enable_event_sync: true\n"
        f"use_layerwise: {'true' if layerwise else 'false'}\n"
        + (f"pack_blocks: {pack_blocks}\n" if pack_blocks > 1 else "")
    )
    parse_ucm_config(yaml.safe_load(path.read_text()))  # the file's one schema, as the connector reads it
    return path


def kv_transfer_config(ucm_config: Path) -> str:
    return json.dumps(
        {
            "kv_connector": "UCMConnector",
            "kv_connector_module_path": "ucm_connector.connector",
            "kv_role": "kv_both",
            "kv_load_failure_policy": "recompute",
            "kv_connector_extra_config": {"UCM_CONFIG_FILE": str(ucm_config)},
        }
    )


def server_env(cache_root: Path, tmpdir: Path, kv_gib: int = 2) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        {
            "VLLM_TARGET_DEVICE": "cpu",
            "VLLM_CPU_KVCACHE_SPACE": str(kv_gib),
            "VLLM_CPU_NUM_OF_RESERVED_CPU": "0",
            "VLLM_CACHE_ROOT": str(cache_root),
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "PYTHONHASHSEED": HASH_SEED,
            "VLLM_SERVER_DEV_MODE": "1",
            "VLLM_LOGGING_LEVEL": "INFO",
            "TMPDIR": str(tmpdir),
            "PATH": f"{VENV_BIN}{os.pathsep}{env.get('PATH', '')}",
        }
    )
    return env


def start_together(*servers: VllmServer) -> None:
    """Start every server, then wait for all of them at once (their loads overlap)."""
    for s in servers:
        s.start()
    with ThreadPoolExecutor(len(servers)) as pool:
        list(pool.map(lambda s: s.wait_ready(), servers))


@dataclass
class VllmServer:
    """One `vllm serve` process group."""

    model: Path
    log_path: Path
    cache_root: Path
    ucm_config: Path | None = None
    dtype: str = "bfloat16"
    max_model_len: int = 8192
    extra_args: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)  # on top of server_env()
    # Eager: `--enforce-eager` and no torch.compile at all (TORCHDYNAMO_DISABLE). The CPU build
    # compiles without Inductor (no speed to gain) and vLLM 0.32 cannot load its own AOT cache
    # here ("'function' object has no attribute 'finalize_loading'"), so every compiled start
    # pays Dynamo again: measured on the tiny model, 69-90 s to healthy compiled, 45 s eager;
    # eager with Dynamo left on pays ~18 s of lazy compiles on its first request instead.
    eager: bool = False
    # The worker inside the EngineCore process (vLLM's UniProcExecutor: `--distributed-executor-backend
    # uni`, with VLLM_ENABLE_V1_MULTIPROCESSING=0, without which vLLM's CPU platform turns uni back
    # into mp) instead of a third process that imports torch and vLLM again. Measured on the
    # 2-core development machine (tiny model, eager, float32, UCMConnector, alternated rounds):
    # one start to healthy 37-47 s with mp, 26-27 s with uni; two started together (as the
    # connector tests start them) 51-67 s vs 36-39 s; the same greedy tokens. Faithful to what
    # the connector meets on a GPU: vLLM with one GPU runs its worker in the engine process the same
    # way (uni), the connector's scheduler half and worker half then share that process, and the API
    # server stays a process of its own (AsyncLLM always runs the engine out of process). What uni
    # leaves out is the OpenMP binding of the worker to VLLM_CPU_OMP_THREADS_BIND, which only the
    # multiproc executor applies: a test that pins servers to cores keeps this off.
    in_process_worker: bool = False
    port: int = 0
    proc: subprocess.Popen | None = None
    tmpdir: Path | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> VllmServer:
        self.port = self.port or free_port()
        self.tmpdir = Path(tempfile.mkdtemp(prefix="ucmv-"))
        args = [
            str(VENV_BIN / "vllm"),
            "serve",
            str(self.model),
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--dtype",
            self.dtype,
            "--seed",
            "0",
            "--max-model-len",
            str(self.max_model_len),
            "--served-model-name",
            "m",
            *self.extra_args,
        ]
        if self.eager:
            args.append("--enforce-eager")
        if self.in_process_worker:
            args += ["--distributed-executor-backend", "uni"]
        if self.ucm_config is not None:
            args += ["--kv-transfer-config", kv_transfer_config(self.ucm_config)]
        log = open(self.log_path, "ab")  # noqa: SIM115 - handed to the child process
        self.proc = subprocess.Popen(
            args,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env={
                **server_env(self.cache_root, self.tmpdir),
                **(EAGER_ENV if self.eager else {}),
                **(IN_PROCESS_WORKER_ENV if self.in_process_worker else {}),
                **self.env,
            },
            start_new_session=True,
        )
        log.close()
        return self

    def wait_ready(self, timeout: float = 300.0) -> VllmServer:
        assert self.proc is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"vllm serve exited with {self.proc.returncode}:\n{self.log_tail()}")
            try:
                with urllib.request.urlopen(f"{self.url}/health", timeout=2) as r:
                    if r.status == 200:
                        return self
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(1.0)
        raise TimeoutError(f"vllm serve not ready after {timeout}s:\n{self.log_tail()}")

    def stop(self, grace: float = 20.0) -> None:
        if self.proc is not None and self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
                self.proc.wait(grace)
            except subprocess.TimeoutExpired:
                pass
            except ProcessLookupError:
                pass
        if self.proc is not None:
            # whatever survived the grace period, the engine and worker included
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        if self.tmpdir is not None:
            shutil.rmtree(self.tmpdir, ignore_errors=True)
            self.tmpdir = None

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def log_tail(self, n: int = 60) -> str:
        return "\n".join(self.log_text().splitlines()[-n:])

    # ---- requests ---------------------------------------------------------------------
    def post(self, path: str, body: dict[str, Any] | None = None, timeout: float = 300.0) -> Any:
        data = json.dumps(body).encode() if body is not None else b""
        req = urllib.request.Request(
            f"{self.url}{path}", data=data, method="POST", headers={"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(req, timeout=timeout) as r:
            text = r.read().decode()
        return json.loads(text) if text.strip().startswith(("{", "[")) else text

    def complete(
        self, prompt: list[int], max_tokens: int = 8, logprobs: int = 5, cache_salt: str | None = None
    ) -> tuple[list[int], list[dict[str, float]]]:
        """Greedy completion of a token-id prompt: (token ids, top logprobs per position)."""
        body: dict[str, Any] = {
            "model": "m",
            "prompt": prompt,
            "max_tokens": max_tokens,
            "temperature": 0.0,
            "logprobs": logprobs,
            "ignore_eos": True,
            "return_tokens_as_token_ids": True,
        }
        if cache_salt is not None:
            body["cache_salt"] = cache_salt
        out = self.post("/v1/completions", body)
        lp = out["choices"][0]["logprobs"]
        tokens = [int(t.removeprefix("token_id:")) for t in lp["tokens"]]
        return tokens, lp["top_logprobs"]

    def metrics(self) -> dict[str, float]:
        with urllib.request.urlopen(f"{self.url}/metrics", timeout=10) as r:
            text = r.read().decode()
        out: dict[str, float] = {}
        for line in text.splitlines():
            if line.startswith("#") or " " not in line:
                continue
            name, value = line.rsplit(" ", 1)
            base = name.split("{", 1)[0]
            out[base] = out.get(base, 0.0) + float(value)
        return out
