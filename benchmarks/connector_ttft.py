"""TTFT of an external prefix hit through UCMConnector, against recompute and a local hit.

On the `medium` model with 4,096-token prompts whose first 80% were seen before:
  (a) recompute: nothing cached (a fresh `cache_salt` per request),
  (b) local hit: instance A serves the prompt after it served its 80% prefix,
  (c) external hit: instance B (same storage, never saw the prefix) serves a prompt with the
      same prefix, loading the prefix blocks that A's connector stored. Its suffix differs
      from (b)'s (same length), because A stores the blocks of (b)'s whole prompt too: with
      the same prompt, B would hit 100% of it instead of the 80% prefix.
Prints the medians and the ratios c/a (target <= 0.33) and c/b (target <= 1.10).

    python benchmarks/connector_ttft.py [--reps 5] [--json out.json]
"""

from __future__ import annotations

import argparse
import http.client
import json
import random
import re
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.support.vllm_server import VllmServer, write_ucm_config

VOCAB = 8192
BLOCK = 128


def ttft_ms(server: VllmServer, prompt: list[int], cache_salt: str | None = None) -> float:
    """Time to the first streamed chunk carrying choices, as `vllm bench serve` defines it."""
    body: dict = {
        "model": "m",
        "prompt": prompt,
        "max_tokens": 1,
        "temperature": 0.0,
        "stream": True,
        "ignore_eos": True,
    }
    if cache_salt is not None:
        body["cache_salt"] = cache_salt
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=600)
    start = time.perf_counter()
    conn.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
    resp = conn.getresponse()
    if resp.status != 200:
        raise RuntimeError(f"HTTP {resp.status}: {resp.read()[:500]!r}")
    first = None
    for raw in resp:
        line = raw.decode().strip()
        if first is None and line.startswith("data: {") and '"choices"' in line:
            first = time.perf_counter()
        if line == "data: [DONE]":
            break
    conn.close()
    if first is None:
        raise RuntimeError("no streamed chunk with choices")
    return (first - start) * 1000.0


def wait_for_files(storage: Path, count: int, timeout: float = 60.0) -> None:
    """A's dumps persist in the background; B looks up persisted blocks."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if sum(1 for p in storage.rglob("*") if p.is_file() and len(p.name) == 32) >= count:
            return
        time.sleep(0.1)
    raise TimeoutError(f"fewer than {count} block files in {storage} after {timeout}s")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model-dir", type=Path, help="a model made by `ucmctl model make-tiny --size medium`")
    ap.add_argument("--input-len", type=int, default=4096)
    ap.add_argument("--prefix-ratio", type=float, default=0.8)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--work-dir", type=Path, help="kept after the run (logs, storage)")
    ap.add_argument("--json", type=Path, help="write the results here")
    args = ap.parse_args()

    work = args.work_dir or Path(tempfile.mkdtemp(prefix="ucm-ttft-"))
    work.mkdir(parents=True, exist_ok=True)
    model = args.model_dir
    if model is None:
        from ucmctl.tinymodel import make_model

        model = make_model(work / "medium", size="medium", seed=0)
    storage = work / "store"
    storage.mkdir(exist_ok=True)
    cfg = write_ucm_config(work / "ucm.yaml", storage, cache_gb=1.0)
    servers = [
        VllmServer(
            model=model,
            log_path=work / f"{n}.log",
            cache_root=work / "vllm-cache",
            ucm_config=cfg,
            max_model_len=args.input_len + 256,
        )
        for n in ("a", "b")
    ]
    prefix_len = int(args.input_len * args.prefix_ratio)
    rng = random.Random(0)

    def tokens(n: int) -> list[int]:
        return [rng.randrange(3, VOCAB) for _ in range(n)]

    results: dict[str, list[float]] = {"recompute": [], "local_hit": [], "external_hit": []}
    try:
        for s in servers:
            s.start()
        with ThreadPoolExecutor(2) as pool:
            list(pool.map(lambda s: s.wait_ready(600), servers))
        a, b = servers
        # Warm-up: the first long request of a server is several times slower; exercise
        # every path (miss, local hit, external hit) once before timing.
        warm_prefix = tokens(prefix_len)
        warm = warm_prefix + tokens(args.input_len - prefix_len)
        ttft_ms(a, warm_prefix)
        ttft_ms(a, warm)
        wait_for_files(storage, prefix_len // BLOCK)
        ttft_ms(b, warm_prefix + tokens(args.input_len - prefix_len))
        ttft_ms(b, tokens(args.input_len), cache_salt="warm")
        for rep in range(args.reps):
            files_before = sum(1 for p in storage.rglob("*") if p.is_file() and len(p.name) == 32)
            prefix = tokens(prefix_len)
            prompt = prefix + tokens(args.input_len - prefix_len)
            other = prefix + tokens(args.input_len - prefix_len)
            results["recompute"].append(ttft_ms(a, prompt, cache_salt=f"recompute-{rep}"))
            ttft_ms(a, prefix)  # preseed: A computes and stores the prefix
            results["local_hit"].append(ttft_ms(a, prompt))
            wait_for_files(storage, files_before + prefix_len // BLOCK)
            results["external_hit"].append(ttft_ms(b, other))
            print(f"rep {rep}: " + ", ".join(f"{k} {v[-1]:.0f} ms" for k, v in results.items()), flush=True)
        hits = b.metrics().get("vllm:external_prefix_cache_hits_total", 0.0)
        ext_blocks = [int(m) for m in re.findall(r"hit external: (\d+)", b.log_text())]
    finally:
        for s in servers:
            s.stop()

    med = {k: statistics.median(v) for k, v in results.items()}
    c_a = med["external_hit"] / med["recompute"]
    c_b = med["external_hit"] / med["local_hit"]
    print(
        f"model {model}, input {args.input_len} tokens, prefix {prefix_len} ({args.prefix_ratio:.0%}), "
        f"{args.reps} reps, median TTFT:"
    )
    print(f"  (a) recompute     {med['recompute']:8.1f} ms")
    print(f"  (b) local hit     {med['local_hit']:8.1f} ms")
    print(
        f"  (c) external hit  {med['external_hit']:8.1f} ms   (B's external hits, blocks per request: "
        f"{ext_blocks}; vLLM counter {hits:.0f} tokens)"
    )
    print(f"  c/a = {c_a:.3f}  (target <= 0.33)")
    print(f"  c/b = {c_b:.3f}  (target <= 1.10)")
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "median_ms": med,
                    "samples_ms": results,
                    "c_over_a": c_a,
                    "c_over_b": c_b,
                    "external_hit_tokens_b": hits,
                },
                indent=2,
            )
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
