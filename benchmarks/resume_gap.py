"""What moving an answer mid-stream costs its client on the real vLLM (issue #48): the resume gap
(the last token before the cut to the first after it, at the client), against the TTFT of a
store hit of the continuation's length, and against the same gap with the store off.

    python benchmarks/resume_gap.py [--trials 6] [--prompt-len 2048] [--cut-after 32]

Real `vllm serve` of the tiny model on the CPU (float32, greedy), the proxy in front:

- store: 1P2D, centralized through one UCM store (`Cache|Posix`). Each trial streams a prompt of
  `--prompt-len` new tokens (120 out) through the proxy; after `--cut-after` tokens the decode
  instance streaming it is drained with `move_after: 0` (what `ucmctl restart` does), so the
  proxy cuts the answer there and continues it on the other decode instance, which loads the
  prompt and the tokens so far from the store (the continuation path of a killed instance,
  without restarting a server per trial: `tests/e2e/test_kv_routing_real_vllm.py` kills one).
  Then the same continuation's prompt goes to the drained instance, its prefix cache reset: the
  TTFT of a store hit of that length.
- no store: two mixed servers without the connector, the same trials: the continuation
  recomputes the prompt and the tokens so far.

Every answer is checked against the same request answered without the cut (greedy: the same
tokens). Targets: resume gap p50 <= 2x the store hit's TTFT p50, and <= 0.5x the gap without
the store.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import tempfile
import time
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.support.proxy_rig import model_and_store, start_proxy

REPO = Path(__file__).resolve().parents[1]
OUTPUT = 120


@dataclass
class Trial:
    gap_s: float  # the client's longest wait between two tokens right after the cut was asked for
    ids: list[int]  # the answer's token ids
    prompt_ids: list[int]
    cut_at: int  # tokens the client had when the cut was asked for
    store_ttft_s: float | None = None


def start_servers(stack: ExitStack, tmp: Path, model: Path, ucm: Path | None, n: int) -> list[str]:
    from tests.support.vllm_server import VllmServer, start_together

    servers = []
    for i in range(n):
        s = VllmServer(model=model, log_path=tmp / f"vllm-{'store' if ucm else 'plain'}-{i}.log",
                       cache_root=tmp / "vllm-cache", ucm_config=ucm, dtype="float32", max_model_len=8192,
                       eager=True, in_process_worker=True)  # fmt: skip
        stack.callback(s.stop)
        servers.append(s)
    start_together(*servers)
    return [s.url for s in servers]


async def post(s: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> Any:
    async with s.post(url, json=body) as r:
        text = await r.read()
        if r.status != 200:
            raise SystemExit(f"{url}: HTTP {r.status}: {text[:300]!r}")
        return json.loads(text) if text else None


async def streaming_instance(s: aiohttp.ClientSession, proxy: str, role: str) -> str:
    async with s.get(proxy + "/instances") as r:
        insts = (await r.json())["instances"]
    (url,) = [i["url"] for i in insts if i["role"] == role and i["requests_streaming"]]
    return str(url)


async def trial(s: aiohttp.ClientSession, proxy: str, role: str, prompt: list[int], cut_after: int) -> Trial:
    """One streamed answer through the proxy, moved off its instance after `cut_after` tokens."""
    body = {"model": "m", "prompt": prompt, "max_tokens": OUTPUT, "temperature": 0.0, "ignore_eos": True,
            "stream": True, "return_token_ids": True}  # fmt: skip
    times: list[float] = []
    ids: list[int] = []
    prompt_ids: list[int] = []
    cut: tuple[float, int] | None = None
    buf = b""
    async with s.post(proxy + "/v1/completions", json=body) as r:
        while chunk := await r.content.readany():
            buf += chunk
            *events, buf = buf.split(b"\n\n")
            for ev in events:
                if not ev.startswith(b"data: {"):
                    continue
                choice = json.loads(ev[6:])["choices"][0]
                prompt_ids = prompt_ids or choice.get("prompt_token_ids") or []
                for t in choice.get("token_ids") or ():
                    ids.append(t)
                    times.append(time.perf_counter())
            if cut is None and len(ids) >= cut_after:
                victim = await streaming_instance(s, proxy, role)
                cut = (time.perf_counter(), len(ids))
                await post(s, proxy + "/instances/drain", {"url": victim, "role": role, "move_after": 0})
    assert cut is not None and len(ids) == OUTPUT, (len(ids), cut)
    # the pause: the longest step among the tokens that came after the move was asked for (the
    # instance may send one or two more before the proxy cuts it)
    after = next(i for i, t in enumerate(times) if t > cut[0])
    gap = max(times[i] - times[i - 1] for i in range(after, min(after + 8, len(times))))
    await post(s, proxy + "/instances/resume", {"url": victim, "role": role})
    return Trial(gap, ids, prompt_ids, cut[1])


async def ttft(s: aiohttp.ClientSession, url: str, prompt: list[int]) -> float:
    body = {"model": "m", "prompt": prompt, "max_tokens": 1, "temperature": 0.0, "stream": True}
    t0 = time.perf_counter()
    async with s.post(url + "/v1/completions", json=body) as r:
        async for line in r.content:
            if line.startswith(b"data: {"):
                return time.perf_counter() - t0
    raise SystemExit(f"{url}: no token")


async def run(proxy: str, role: str, decodes: list[str], prompts: list[list[int]], args: Any) -> list[Trial]:
    timeout = aiohttp.ClientTimeout(total=600)
    out = []
    async with aiohttp.ClientSession(timeout=timeout) as s:
        await trial(s, proxy, role, [7] * 300, args.cut_after)  # warm: every path compiled once
        for prompt in prompts:
            reference = await post(s, decodes[0] + "/v1/completions", {"model": "m", "prompt": prompt,
                                   "max_tokens": OUTPUT, "temperature": 0.0, "ignore_eos": True,
                                   "return_token_ids": True})  # fmt: skip
            # the reference filled the first decode's cache: cleared, so that the moved answer and
            # its continuation find the prompt only in the store (or nowhere)
            for url in decodes:
                await post(s, url + "/reset_prefix_cache", {})
            t = await trial(s, proxy, role, prompt, args.cut_after)
            assert t.ids == reference["choices"][0]["token_ids"], "the moved answer differs"
            if role == "decode":
                # a store hit of the continuation's length: its prompt where only the store has it
                context = t.prompt_ids + t.ids[: t.cut_at]
                for url in decodes:
                    await post(s, url + "/reset_prefix_cache", {})
                t.store_ttft_s = await ttft(s, decodes[0], context)
            out.append(t)
            print(f"  gap {t.gap_s * 1e3:7.1f} ms after {t.cut_at} tokens"
                  + (f"; store hit TTFT {t.store_ttft_s * 1e3:7.1f} ms" if t.store_ttft_s else ""),
                  flush=True)  # fmt: skip
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trials", type=int, default=6)
    ap.add_argument("--prompt-len", type=int, default=2048)
    ap.add_argument("--cut-after", type=int, default=32)
    args = ap.parse_args()
    rng = random.Random(48)
    prompts = [[rng.randrange(10, 900) for _ in range(args.prompt_len)] for _ in range(args.trials)]
    (REPO / "build").mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="ucm-resume-", dir=REPO / "build") as name:
        tmp = Path(name)
        model, ucm = model_and_store(tmp)
        results: dict[str, list[Trial]] = {}
        for label, store in (("store", True), ("no store", False)):
            with ExitStack() as stack:
                if store:
                    p, *decodes = start_servers(stack, tmp, model, ucm, 3)
                    flags = ["--mode", "pd", "--prefiller", p]
                    flags += [f for d in decodes for f in ("--decoder", d)]
                    role = "decode"
                else:
                    decodes = start_servers(stack, tmp, model, None, 2)
                    flags = ["--mode", "mixed", *(f for d in decodes for f in ("--instance", d))]
                    role = "mixed"
                proc, url = start_proxy([*flags, "--health-interval", "0.5"], tmp / f"proxy-{store}.log")
                stack.callback(proc.wait)
                stack.callback(proc.kill)
                print(f"--- {label}: {len(prompts)} trials of {args.prompt_len} tokens", flush=True)
                results[label] = asyncio.run(run(url, role, decodes, prompts, args))
    gap = statistics.median(t.gap_s for t in results["store"])
    hit = statistics.median(t.store_ttft_s or 0.0 for t in results["store"])
    plain = statistics.median(t.gap_s for t in results["no store"])
    print(f"resume gap p50: {gap * 1e3:.0f} ms with the store, {plain * 1e3:.0f} ms without; store hit TTFT "
          f"p50 {hit * 1e3:.0f} ms")  # fmt: skip
    met_hit, met_plain = gap <= 2 * hit, gap <= 0.5 * plain
    said = {True: "met", False: "NOT MET"}
    print(f"gap / store hit TTFT {gap / hit:.2f}x (target <= 2x: {said[met_hit]}); "
          f"gap / gap without the store {gap / plain:.2f}x (target <= 0.5x: {said[met_plain]})")
    return 0 if met_hit and met_plain else 1


if __name__ == "__main__":
    sys.exit(main())
