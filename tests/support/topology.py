"""Topology files for tests of real deployments: the node lines of test hosts, the real vLLM's
role settings, a one-server simulator deployment, a file in the test's folder."""

from __future__ import annotations

import sys
from pathlib import Path

from tests.support.netns import Cluster


def node_lines(c: Cluster, names: list[str], platform: str = "cpu") -> str:
    return "\n".join(
        f"  {n}: {{host: {c.host(n).address}, key: {c.key}, platform: {platform}, python: {sys.executable}}}"
        for n in names
    )


def vllm_role(nodes: str, port: int, more: str = "") -> str:
    """A prefill/decode/mixed section (on `nodes`, such as "h1, h2"; `more` keys after the
    flags, such as ", restart: {...}") for the real vLLM on the CPU with the tiny model:
    offline, a 1 GiB KV cache, eager (VllmServer.eager says why), blocks of 128 tokens, and the
    worker inside the engine process (`distributed-executor-backend: uni`, with
    VLLM_ENABLE_V1_MULTIPROCESSING=0: VllmServer.in_process_worker says why, and that this is how
    vLLM runs on one GPU): one import of torch and vLLM less per start, ~10 s on 2 cores. One
    server per node: vLLM binds no cores then (only its multiproc executor applies
    VLLM_CPU_OMP_THREADS_BIND, which `up` asks for where two servers share a node)."""
    env = ('VLLM_CPU_KVCACHE_SPACE: "1", HF_HUB_OFFLINE: "1", TRANSFORMERS_OFFLINE: "1", '
           'TORCHDYNAMO_DISABLE: "1", VLLM_ENABLE_V1_MULTIPROCESSING: "0"')  # fmt: skip
    flags = ("max-model-len: 2048, block-size: 128, max-num-seqs: 4, enforce-eager: true, "
             "distributed-executor-backend: uni")  # fmt: skip
    return f"{{nodes: [{nodes}], port: {port}, env: {{{env}}}, flags: {{{flags}}}{more}}}"


def mixed_sim(name: str, nodes: str, on: str, port: int) -> str:
    """A one-server mixed deployment of the simulator on node `on`; `nodes` as node_lines gives."""
    return f"""
name: {name}
mode: mixed
engine: sim
model: {{path: sim-model}}
nodes:
{nodes}
mixed: {{nodes: [{on}], port: {port}}}
"""


def write(tmp: Path, text: str) -> Path:
    """A topology file in the test's folder."""
    path = tmp / "topology.yaml"
    path.write_text(text)
    return path
