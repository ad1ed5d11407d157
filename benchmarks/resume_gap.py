"""What moving an answer mid-stream costs its client on the real vLLM (issue #48): the resume gap
(the last token before the cut to the first after it, at the client), against the TTFT of a
store hit of the continuation's length, and against the same gap with the store off.

    python benchmarks/resume_gap.py [--trials 6] [--prompt-len 2048] [--cut-after 32]

Real `vllm serve` of the tiny model on the CPU (float32, greedy), the proxy in front. Each trial
streams a prompt of `--prompt-len` new tokens (120 out) through the proxy; after `--cut-after`
tokens the instance streaming it is cut off, and the proxy continues the answer on another:

- store, drain (first, on the fresh deployment): 1P2D, centralized through one UCM store
  (`Cache|Posix`); the decode instance streaming the answer is drained with `move_after: 0`
  (what `ucmctl restart` does): the same continuation, but the drained server stays up and goes
  on computing until it sees its request gone, on the same two cores as the one continuing.
- store, kill (then): the same deployment; the decode instance streaming the answer is killed
  (SIGKILL to its process group), as the issue's target says.
  The other decode instance loads the prompt and the tokens so far from the store. The killed
  server is started again (same port) before the next trial, and is then, warmed up, where the
  store hit's TTFT is measured: the continuation's prompt sent to an instance whose DRAM tier
  does not hold it (it reads the shared Posix tier, as the continuation did).
- no store, kill: two mixed servers without the connector, the same kills: the continuation
  recomputes the prompt and the tokens so far.

Each trial also reads the proxy's own gap (`ucmctl_proxy_migration_gap_seconds`: its last bytes
of the old leg to the continuation's first), which leaves out the client's side; the continuing
server's own account of the continuation (vLLM's TTFT, queue and prefill time, external hits:
its /metrics before and after); and for a kill, how long the killed server's process took to be
gone (SIGKILL to reaped): its connections close only as it exits, after the kernel has freed its
memory, so until then the proxy sees an answer gone silent, not a failure.

Every answer is checked against the same request answered without the cut (greedy: the same
tokens). Targets (on the kill): resume gap p50 <= 2x the store hit's TTFT p50, and <= 0.5x the
gap without the store.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.support.proxy_rig import model_and_store, start_proxy
from tests.support.vllm_server import VllmServer, start_together
from ucmctl.core.exposition import samples

REPO = Path(__file__).resolve().parents[1]
OUTPUT = 120


@dataclass
class Trial:
    gap_s: float  # the client's longest wait between two tokens right after the cut was asked for
    ids: list[int]  # the answer's token ids
    prompt_ids: list[int]
    cut_at: int  # tokens the client had when the cut was asked for
    store_ttft_s: float | None = None
    seam_s: float = 0.0  # the proxy's own gap: its last bytes of the old leg to the continuation's first
    lead_s: float = 0.0  # the client's last token before the cut was asked for, to the ask
    exit_s: float | None = None  # a kill: SIGKILL sent to the killed server's process reaped
    cont: dict[str, float] | None = None  # the continuing server's own account of the continuation
    hit: dict[str, float] | None = None  # the same of the store hit


# vLLM's own account of a request (histogram sums, counters), read before and after it
SERVER = {
    "ttft": "vllm:time_to_first_token_seconds_sum",
    "queue": "vllm:request_queue_time_seconds_sum",
    "prefill": "vllm:request_prefill_time_seconds_sum",
    "external": "vllm:external_prefix_cache_hits_total",
    "prompt": "vllm:prompt_tokens_total",
}


async def server_sums(s: aiohttp.ClientSession, url: str) -> dict[str, float]:
    async with s.get(url + "/metrics") as r:
        text = await r.text()
    key_of = {metric: k for k, metric in SERVER.items()}
    sums = dict.fromkeys(SERVER, 0.0)
    for sample in samples(text, tuple(key_of)):
        if sample.name in key_of:
            sums[key_of[sample.name]] += sample.value
    return sums


def since(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    return {k: after[k] - before[k] for k in SERVER}


def account(d: dict[str, float] | None) -> str:
    if d is None:
        return "-"
    ms = {k: f"{d[k] * 1e3:.0f}" for k in ("ttft", "queue", "prefill")}
    return (f"ttft {ms['ttft']} ms (queue {ms['queue']}, prefill {ms['prefill']}), "
            f"{d['external']:.0f} of {d['prompt']:.0f} tokens external")  # fmt: skip


def start_servers(stack: ExitStack, tmp: Path, model: Path, ucm: Path | None, n: int) -> list[VllmServer]:
    servers = []
    for i in range(n):
        s = VllmServer(model=model, log_path=tmp / f"vllm-{'store' if ucm else 'plain'}-{i}.log",
                       cache_root=tmp / "vllm-cache", ucm_config=ucm, dtype="float32", max_model_len=8192,
                       eager=True, in_process_worker=True)  # fmt: skip
        stack.callback(s.stop)
        servers.append(s)
    start_together(*servers)
    return servers


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


async def trial(s: aiohttp.ClientSession, proxy: str, role: str, prompt: list[int], cut_after: int,
                cut: Callable[[str], Awaitable[None]]) -> tuple[Trial, str]:  # fmt: skip
    """One streamed answer through the proxy, its instance cut off (`cut`) after `cut_after`
    tokens; the trial and the instance cut off."""
    body = {"model": "m", "prompt": prompt, "max_tokens": OUTPUT, "temperature": 0.0, "ignore_eos": True,
            "stream": True, "return_token_ids": True}  # fmt: skip
    times: list[float] = []
    ids: list[int] = []
    prompt_ids: list[int] = []
    asked: tuple[float, int] | None = None
    victim = ""
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
            if asked is None and len(ids) >= cut_after:
                victim = await streaming_instance(s, proxy, role)
                asked = (time.perf_counter(), len(ids))
                await cut(victim)
    assert asked is not None and len(ids) == OUTPUT, (len(ids), asked)
    # the pause: the longest step among the tokens that came after the cut was asked for (a
    # drained instance may send one or two more before the proxy cuts it)
    after = next(i for i, t in enumerate(times) if t > asked[0])
    gap = max(times[i] - times[i - 1] for i in range(after, min(after + 8, len(times))))
    return Trial(gap, ids, prompt_ids, asked[1], lead_s=asked[0] - times[after - 1]), victim


async def proxy_gaps(s: aiohttp.ClientSession, proxy: str) -> float:
    """The sum of the proxy's migration gaps so far (`ucmctl_proxy_migration_gap_seconds`)."""
    async with s.get(proxy + "/metrics") as r:
        text = await r.text()
    return sum(float(line.split()[-1]) for line in text.splitlines()
               if line.startswith("ucmctl_proxy_migration_gap_seconds_sum"))  # fmt: skip


async def ttft(s: aiohttp.ClientSession, url: str, prompt: list[int]) -> float:
    body = {"model": "m", "prompt": prompt, "max_tokens": 1, "temperature": 0.0, "stream": True}
    t0 = time.perf_counter()
    async with s.post(url + "/v1/completions", json=body) as r:
        async for line in r.content:
            if line.startswith(b"data: {"):
                return time.perf_counter() - t0
    raise SystemExit(f"{url}: no token")


async def healthy_at(s: aiohttp.ClientSession, proxy: str, url: str, role: str) -> None:
    """Wait until the proxy routes to `url` again."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        async with s.get(proxy + "/instances") as r:
            if any(
                i["url"] == url and i["role"] == role and i["healthy"] for i in (await r.json())["instances"]
            ):
                return
        await asyncio.sleep(0.2)
    raise SystemExit(f"the proxy does not route to {url} again")


def restart(server: VllmServer) -> None:
    """The killed server started again on its port (its DRAM tier empty)."""
    server.stop()
    server.start()
    server.wait_ready()


async def run(proxy: str, role: str, servers: dict[str, VllmServer], prompts: list[list[int]], args: Any,
              how: str) -> list[Trial]:  # fmt: skip
    """The trials of one cut (`how`: kill or drain) of the answer's instance."""
    timeout = aiohttp.ClientTimeout(total=600)
    decodes = list(servers)
    out = []
    async with aiohttp.ClientSession(timeout=timeout) as s:
        exits: list[float] = []

        async def kill(url: str) -> None:
            proc = servers[url].proc
            assert proc is not None
            t0 = time.perf_counter()
            os.killpg(proc.pid, signal.SIGKILL)
            # its sockets close as it exits, after its memory is torn down: when the proxy can know
            await asyncio.to_thread(proc.wait)
            exits.append(time.perf_counter() - t0)

        async def drain(url: str) -> None:
            await post(s, proxy + "/instances/drain", {"url": url, "role": role, "move_after": 0})

        cut = kill if how == "kill" else drain
        await trial(s, proxy, role, [7] * 300, args.cut_after, drain)  # warm: every path compiled once
        for url in decodes:
            await post(s, proxy + "/instances/resume", {"url": url, "role": role})
        for prompt in prompts:
            reference = await post(s, decodes[0] + "/v1/completions", {"model": "m", "prompt": prompt,
                                   "max_tokens": OUTPUT, "temperature": 0.0, "ignore_eos": True,
                                   "return_token_ids": True})  # fmt: skip
            # the reference filled the first decode's cache: cleared, so that the moved answer and
            # its continuation find the prompt only in the store (or nowhere)
            for url in decodes:
                await post(s, url + "/reset_prefix_cache", {})
            gaps = await proxy_gaps(s, proxy)
            sums = {url: await server_sums(s, url) for url in decodes}
            t, victim = await trial(s, proxy, role, prompt, args.cut_after, cut)
            t.seam_s = await proxy_gaps(s, proxy) - gaps
            t.exit_s = exits.pop() if exits else None
            (survivor,) = [url for url in decodes if url != victim]
            t.cont = since(sums[survivor], await server_sums(s, survivor))
            assert t.ids == reference["choices"][0]["token_ids"], "the moved answer differs"
            if how == "kill":
                await asyncio.to_thread(restart, servers[victim])
                await healthy_at(s, proxy, victim, role)
                if role == "decode":
                    # a store hit of the continuation's length, on the server started again:
                    # warmed first, its DRAM tier does not hold the prompt (the shared tier does)
                    await ttft(s, victim, [11 + len(out)] * 300)
                    before = await server_sums(s, victim)
                    t.store_ttft_s = await ttft(s, victim, t.prompt_ids + t.ids[: t.cut_at])
                    await asyncio.sleep(0.5)  # its queue and prefill times are counted when it ends
                    t.hit = since(before, await server_sums(s, victim))
            else:
                await post(s, proxy + "/instances/resume", {"url": victim, "role": role})
            out.append(t)
            print(f"  gap {t.gap_s * 1e3:7.1f} ms after {t.cut_at} tokens "
                  f"(the proxy's {t.seam_s * 1e3:5.1f} ms)"
                  + (f"; store hit TTFT {t.store_ttft_s * 1e3:7.1f} ms" if t.store_ttft_s else "")
                  + f"\n    last token to the cut {t.lead_s * 1e3:.0f} ms"
                  + (f"; SIGKILL to the process gone {t.exit_s * 1e3:.0f} ms" if t.exit_s is not None else "")
                  + f"\n    continuation, by its server: {account(t.cont)}"
                  + f"\n    store hit, by its server: {account(t.hit)}",
                  flush=True)  # fmt: skip
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trials", type=int, default=6)
    ap.add_argument("--prompt-len", type=int, default=2048)
    ap.add_argument("--cut-after", type=int, default=32)
    args = ap.parse_args()
    rng = random.Random(48)

    def prompts() -> list[list[int]]:  # new ones for each run: none is in the store yet
        return [[rng.randrange(10, 900) for _ in range(args.prompt_len)] for _ in range(args.trials)]

    (REPO / "build").mkdir(exist_ok=True)
    results: dict[str, list[Trial]] = {}
    with tempfile.TemporaryDirectory(prefix="ucm-resume-", dir=REPO / "build") as name:
        tmp = Path(name)
        model, ucm = model_and_store(tmp)
        for label, store in (("store", True), ("no store", False)):
            with ExitStack() as stack:
                if store:
                    p, *decodes = start_servers(stack, tmp, model, ucm, 3)
                    flags = ["--mode", "pd", "--prefiller", p.url]
                    flags += [f for d in decodes for f in ("--decoder", d.url)]
                    role = "decode"
                else:
                    decodes = start_servers(stack, tmp, model, None, 2)
                    flags = ["--mode", "mixed", *(f for d in decodes for f in ("--instance", d.url))]
                    role = "mixed"
                proc, url = start_proxy([*flags, "--health-interval", "0.5"], tmp / f"proxy-{store}.log")
                stack.callback(proc.wait)
                stack.callback(proc.kill)
                servers = {d.url: d for d in decodes}
                for how in ("drain", "kill") if store else ("kill",):
                    print(f"--- {label}, {how}: {args.trials} trials of {args.prompt_len} tokens", flush=True)
                    results[f"{label}, {how}"] = asyncio.run(run(url, role, servers, prompts(), args, how))
    for row, trials in results.items():
        seam = statistics.median(t.seam_s for t in trials)
        print(
            f"{row}: client's gap p50 {statistics.median(t.gap_s for t in trials) * 1e3:.0f} ms, "
            f"the proxy's (last bytes of the old leg to the continuation's first) p50 {seam * 1e3:.0f} ms"
        )
    gap = statistics.median(t.gap_s for t in results["store, kill"])
    hit = statistics.median(t.store_ttft_s or 0.0 for t in results["store, kill"])
    drained = statistics.median(t.gap_s for t in results["store, drain"])
    plain = statistics.median(t.gap_s for t in results["no store, kill"])
    print(f"resume gap p50 (kill): {gap * 1e3:.0f} ms with the store, {plain * 1e3:.0f} ms without; "
          f"store hit TTFT p50 {hit * 1e3:.0f} ms; resume gap p50 (drain, with the store) "
          f"{drained * 1e3:.0f} ms")  # fmt: skip
    # the kill's own part: the killed API server closes its connections only as it exits, after
    # the kernel has freed its memory; what follows is the proxy's, the store's and the engine's
    kills = [t for t in results["store, kill"] if t.exit_s is not None]
    gone = statistics.median(t.gap_s - t.lead_s - (t.exit_s or 0.0) for t in kills)
    seam = statistics.median(t.seam_s - (t.exit_s or 0.0) for t in kills)
    exit_s = statistics.median(t.exit_s or 0.0 for t in kills)
    print(f"of the kill's gap: SIGKILL to the process gone p50 {exit_s * 1e3:.0f} ms; after it, the client's "
          f"gap p50 {gone * 1e3:.0f} ms ({gone / hit:.2f}x the store hit TTFT), the proxy's p50 "
          f"{seam * 1e3:.0f} ms ({seam / hit:.2f}x)")  # fmt: skip
    met_hit, met_plain = gap <= 2 * hit, gap <= 0.5 * plain
    said = {True: "met", False: "NOT MET"}
    print(
        f"gap / store hit TTFT {gap / hit:.2f}x (target <= 2x: {said[met_hit]}); "
        f"gap / gap without the store {gap / plain:.2f}x (target <= 0.5x: {said[met_plain]}); "
        f"drain gap / store hit TTFT {drained / hit:.2f}x"
    )
    return 0 if met_hit and met_plain else 1


if __name__ == "__main__":
    sys.exit(main())
