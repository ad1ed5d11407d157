"""The proxy's routing policies side by side: the same multi-turn load through each, on the same
four simulator instances (mixed), one run.

    python benchmarks/routing.py [--users 16] [--rounds 4] [--system-tokens 512]
                                 [--question-tokens 256] [--output-len 32] [--hbm-tokens 4096]

Four `ucmctl sim serve` instances with the calibrated profile of the real CPU vLLM
(`medium-cpu`), block 16, each with a local prefix cache of --hbm-tokens tokens (the
conversations' histories together exceed one instance's, each instance's share fits) and the
UCM store attached (`Cache|Posix`, one store for all four, so that any instance can load what
another computed). For each policy a proxy (`ucmctl proxy --mode mixed --routing P`) fronts
them and `ucmctl bench --workload multi-turn` sends the load (every user's rounds in turn, the
users at once); each policy gets its own prompt seed, so that no run finds another's blocks in
the store. The figures: TTFT (mean over every request, and the worst round's p90, ms) from the
saved results, and the hit rates the instances themselves count across the run (local: their
own prefix cache; external: loaded from the store), as ratios against round-robin and
least-loaded. `kv` runs twice: on the proxy's approximate index (its own routing history),
and on the simulators' KV-cache events (each publishes vLLM's events on a ZMQ socket of its own,
`--kv-events-config`, which the proxy follows: `--kv-events URL=tcp://...`); its speeds are
measured on the way (GET /routing, printed).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from contextlib import ExitStack
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.support import bench_cli
from tests.support.processes import free_port, sim_server
from tests.support.vllm_server import kv_transfer_config, write_ucm_config

REPO = Path(__file__).resolve().parents[1]
BLOCK = 16
KV_BYTES_PER_TOKEN = 16384  # the medium-cpu profile's
# (row, routing policy, the proxy follows the instances' KV-cache events)
POLICIES = (
    ("round-robin", "round-robin", False),
    ("least-loaded", "least-loaded", False),
    ("session", "session", False),
    ("kv (routing history)", "kv", False),
    ("kv (KV events)", "kv", True),
)
COUNTERS = {
    "queries": "vllm:prefix_cache_queries_total",
    "local": "vllm:prefix_cache_hits_total",
    "external_queries": "vllm:external_prefix_cache_queries_total",
    "external": "vllm:external_prefix_cache_hits_total",
}


def counter(url: str, name: str) -> float:
    text = urllib.request.urlopen(url + "/metrics", timeout=10).read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name + "{"))


def counts(urls: list[str]) -> dict[str, float]:
    return {k: sum(counter(u, name) for u in urls) for k, name in COUNTERS.items()}


def proxy(
    urls: list[str], policy: str, events: dict[str, int], log: Path
) -> tuple[subprocess.Popen[bytes], str]:
    """A proxy in front of `urls`; following each one's KV-cache events at `events[url]` where given."""
    port = free_port()
    argv = [sys.executable, "-m", "ucmctl.proxy", "--host", "127.0.0.1", "--port", str(port), "--mode",
            "mixed", "--routing", policy, "--block-size", str(BLOCK), "--health-interval", "0.5"]  # fmt: skip
    for u in urls:
        argv += ["--instance", u]
        if u in events:
            argv += ["--kv-events", f"{u}=tcp://127.0.0.1:{events[u]}"]
    if events:
        argv += ["--served-model", served_model(urls[0])]
    with log.open("wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            if urllib.request.urlopen(url + "/health", timeout=1).status == 200:
                return proc, url
        except OSError:
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError(f"the proxy did not answer: {log.read_text()[-2000:]}")


def served_model(url: str) -> str:
    """The model name a server serves (what bench's requests carry: the proxy's block keys' seed)."""
    return str(json.loads(urllib.request.urlopen(url + "/v1/models", timeout=5).read())["data"][0]["id"])


def run_policy(
    row: str,
    policy: str,
    events: dict[str, int],
    seed: int,
    urls: list[str],
    model: Path,
    tmp: Path,
    args: argparse.Namespace,
) -> dict:
    name = row.replace(" ", "-").replace("(", "").replace(")", "")
    proc, url = proxy(urls, policy, events, tmp / f"proxy-{name}.log")
    try:
        before = counts(urls)
        doc = bench_cli.bench_json(
            url, model, tmp / f"{name}.json", "--workload", "multi-turn", "--users", str(args.users),
            "--rounds", str(args.rounds), "--system-tokens", str(args.system_tokens), "--question-tokens",
            str(args.question_tokens), "--output-len", str(args.output_len), "--seed", str(seed),
        )  # fmt: skip
        after = counts(urls)
        routing = json.loads(urllib.request.urlopen(url + "/routing", timeout=5).read())
    finally:
        proc.kill()
        proc.wait()
    phases = [c["measure"] for c in doc["cells"]]
    done = sum(p["completed"] for p in phases)
    delta = {k: after[k] - before[k] for k in COUNTERS}
    return {
        "completed": done,
        "failed": sum(p["failed"] for p in phases),
        "ttft_mean": sum(p["mean_ttft_ms"] * p["completed"] for p in phases) / max(done, 1),
        "ttft_p90_worst_round": max(p["p90_ttft_ms"] for p in phases),
        "local_hit": delta["local"] / max(delta["queries"], 1),
        "external_hit": delta["external"] / max(delta["queries"], 1),
        "routing": routing,
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--users", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--system-tokens", type=int, default=512)
    ap.add_argument("--question-tokens", type=int, default=256)
    ap.add_argument("--output-len", type=int, default=32)
    ap.add_argument("--hbm-tokens", type=int, default=4096, help="each instance's local prefix cache")
    ap.add_argument("--instances", type=int, default=4)
    args = ap.parse_args()
    print("load average at start: {:.2f} {:.2f} {:.2f}".format(*os.getloadavg()), flush=True)
    (REPO / "build").mkdir(exist_ok=True)
    results: dict[str, dict] = {}
    with (
        tempfile.TemporaryDirectory(prefix="ucm-routing-", dir=REPO / "build") as tmp_name,
        ExitStack() as stack,
    ):
        tmp = Path(tmp_name)
        from ucmctl.tinymodel import make_model

        model = make_model(tmp / "tiny", size="tiny", seed=0)  # its tokenizer makes the prompts
        store = tmp / "store"
        store.mkdir()
        ucm = write_ucm_config(tmp / "ucm.yaml", store, cache_gb=0.5)
        gib = args.hbm_tokens * KV_BYTES_PER_TOKEN / 2**30
        flags = ("--profile", "medium-cpu", "--block-size", str(BLOCK), "--kv-cache-gib", f"{gib:.9f}",
                 "--kv-transfer-config", kv_transfer_config(ucm))  # fmt: skip
        urls, ports = [], []
        for _ in range(args.instances):  # each publishes its KV-cache events, as vLLM with the plan's flag
            ports.append(free_port())
            config = {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": f"tcp://*:{ports[-1]}"}
            sim = sim_server(
                tmp, *flags, "--kv-events-config", json.dumps(config), model=str(model), timeout=60
            )
            urls.append(stack.enter_context(sim).url)
        for seed, (row, policy, follows) in enumerate(POLICIES, start=1):
            events = dict(zip(urls, ports, strict=True)) if follows else {}
            results[row] = run_policy(row, policy, events, seed, urls, model, tmp, args)
            r = results[row]
            print(f"{row}: {r['completed']} done, {r['failed']} failed, TTFT mean {r['ttft_mean']:.0f} ms",
                  flush=True)  # fmt: skip

    rr, ll = results["round-robin"], results["least-loaded"]
    print()
    print(
        f"multi-turn: {args.users} users x {args.rounds} rounds, system {args.system_tokens}, question "
        f"{args.question_tokens}, answer {args.output_len} tokens; {args.instances} mixed simulators "
        f"(medium-cpu profile, block {BLOCK}, local cache {args.hbm_tokens} tokens each, one UCM store)"
    )
    print()
    cols = ("policy", "TTFT mean ms", "vs rr", "vs ll", "worst round's TTFT p90 ms", "vs rr", "vs ll",
            "local hit", "external hit")  # fmt: skip
    print("| " + " | ".join(cols) + " |")
    print("|---|---|---|---|---|---|---|---|---|")
    for row, r in results.items():
        print(
            f"| {row} | {r['ttft_mean']:.0f} | {r['ttft_mean'] / rr['ttft_mean']:.2f}x | "
            f"{r['ttft_mean'] / ll['ttft_mean']:.2f}x | {r['ttft_p90_worst_round']:.0f} | "
            f"{r['ttft_p90_worst_round'] / rr['ttft_p90_worst_round']:.2f}x | "
            f"{r['ttft_p90_worst_round'] / ll['ttft_p90_worst_round']:.2f}x | "
            f"{100 * r['local_hit']:.1f}% | {100 * r['external_hit']:.1f}% |"
        )
    for row in ("kv (routing history)", "kv (KV events)"):
        kv = results[row]["routing"]
        print()
        print(
            f"{row}: index {kv['index']}, {kv['blocks']} blocks; prefill {kv['prefill']}; load {kv['load']}"
        )
        if kv.get("kv_events"):
            print(f"  events: {json.dumps(kv['kv_events'])}")


if __name__ == "__main__":
    main()
