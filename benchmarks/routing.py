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

`--workload trace` replays a Mooncake-format trace of shared prefixes instead (`ucmctl bench
make-trace --pattern shared-prefix`: --requests at --rate, prompts of --input-len tokens on
average, half of each from one of --groups prefixes), and `--workload unique` one with no reuse
at all (`--pattern unique`: the policy must not hurt). A row `kv without the store term` is the
ablation: what only the store holds counts as computed (`ucmctl proxy --kv-no-store`).

With `--engine vllm`: two real `vllm serve` instances on the CPU (the tiny model, float32, block
128, eager, one UCM store, each publishing its KV-cache events) instead, and round-robin,
least-loaded and `kv` (KV events) only; beside TTFT, each round's median TTFT (the later rounds'
are where the history is), and for `kv` the local hits it expected against vLLM's own counters.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import urllib.request
from collections import OrderedDict
from contextlib import ExitStack
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.support import bench_cli
from tests.support.processes import free_port, sim_server
from tests.support.proxy_rig import model_and_store, start_proxy
from tests.support.vllm_server import kv_transfer_config

REPO = Path(__file__).resolve().parents[1]
BLOCK = 16
VLLM_BLOCK = 128  # vLLM's block size on the CPU
KV_BYTES_PER_TOKEN = 16384  # the medium-cpu profile's
# (row, routing policy, the proxy follows the instances' KV-cache events)
POLICIES = (
    ("round-robin", "round-robin", False, ()),
    ("least-loaded", "least-loaded", False, ()),
    ("session", "session", False, ()),
    ("kv (routing history)", "kv", False, ()),
    ("kv (KV events)", "kv", True, ()),
    # the ablation: what only the store holds counts as computed
    ("kv without the store term (KV events)", "kv", True, ("--kv-no-store",)),
)
VLLM_POLICIES = (
    ("round-robin", "round-robin", False, ()),
    ("least-loaded", "least-loaded", False, ()),
    ("kv (KV events)", "kv", True, ()),
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
    urls: list[str], policy: str, events: dict[str, int], log: Path, block: int, flags: tuple[str, ...]
) -> tuple[subprocess.Popen[bytes], str]:
    """A proxy in front of `urls`; following each one's KV-cache events at `events[url]` where given."""
    argv = [
        "--mode",
        "mixed",
        "--routing",
        policy,
        "--block-size",
        str(block),
        "--health-interval",
        "0.5",
        *flags,
    ]
    for u in urls:
        argv += ["--instance", u]
        if u in events:
            argv += ["--kv-events", f"{u}=tcp://127.0.0.1:{events[u]}"]
    if events:
        argv += ["--served-model", served_model(urls[0])]
    return start_proxy(argv, log)


def served_model(url: str) -> str:
    """The model name a server serves (what bench's requests carry: the proxy's block keys' seed)."""
    return str(json.loads(urllib.request.urlopen(url + "/v1/models", timeout=5).read())["data"][0]["id"])


def workload(args: argparse.Namespace, seed: int, tmp: Path) -> list[str]:
    """`ucmctl bench`'s workload arguments for --workload, with its prompt seed."""
    if args.workload == "multi-turn":
        return ["--workload", "multi-turn", "--users", str(args.users), "--rounds", str(args.rounds),
                "--system-tokens", str(args.system_tokens), "--question-tokens", str(args.question_tokens),
                "--output-len", str(args.output_len), "--seed", str(seed)]  # fmt: skip
    # one trace for every policy (the same arrivals and lengths); each its own prompt seed
    trace = tmp / "trace.jsonl"
    pattern = "shared-prefix" if args.workload == "trace" else "unique"
    if not trace.exists():
        made = bench_cli.make_trace(
            trace, "--requests", str(args.requests), "--rate", str(args.rate), "--input-len",
            str(args.input_len), "--output-len", str(args.output_len), "--pattern", pattern, "--groups",
            str(args.groups), "--seed", "0",
        )  # fmt: skip
        print(made, flush=True)
    return ["--workload", "trace", "--trace", str(trace), "--seed", str(seed)]


def run_policy(
    row: str,
    policy: str,
    flags: tuple[str, ...],
    events: dict[str, int],
    seed: int,
    urls: list[str],
    model: Path,
    tmp: Path,
    args: argparse.Namespace,
) -> dict:
    name = row.replace(" ", "-").replace("(", "").replace(")", "")
    proc, url = proxy(urls, policy, events, tmp / f"proxy-{name}.log", args.block, flags)
    try:
        before = counts(urls)
        local_before = [counter(u, COUNTERS["local"]) for u in urls]
        doc = bench_cli.bench_json(url, model, tmp / f"{name}.json", *workload(args, seed, tmp))
        after = counts(urls)
        local = [counter(u, COUNTERS["local"]) - b for u, b in zip(urls, local_before, strict=True)]
        routing = json.loads(urllib.request.urlopen(url + "/routing", timeout=5).read())
    finally:
        proc.kill()
        proc.wait()
    cells = doc["cells"]
    phases = [c["measure"] for c in cells if c.get("round") is not None] or [c["measure"] for c in cells]
    # multi-turn: its cell of rounds 2..R; a trace: its one cell
    later = next((c["measure"] for c in cells if c.get("aggregate")), phases[0] if len(phases) == 1 else None)
    done = sum(p["completed"] for p in phases)
    delta = {k: after[k] - before[k] for k in COUNTERS}
    return {
        "completed": done,
        "failed": sum(p["failed"] for p in phases),
        "ttft_mean": sum(p["mean_ttft_ms"] * p["completed"] for p in phases) / max(done, 1),
        "ttft_p90_worst_round": max(p["p90_ttft_ms"] for p in phases),
        "local_hit": delta["local"] / max(delta["queries"], 1),
        "external_hit": delta["external"] / max(delta["queries"], 1),
        "round_p50s": [p.get("median_ttft_ms") for p in phases],
        "later_p50": later["median_ttft_ms"] if later else None,
        "local_by_instance": local,
        "urls": urls,
        "routing": routing,
    }


def pinned_oracle(args: argparse.Namespace) -> float:
    """The local hit rate of an oracle on the multi-turn load: each conversation pinned to one
    instance (user u to instance u mod N), each instance a prefix cache of --hbm-tokens that
    evicts the least recently used block, the requests taken one at a time in the order bench
    sends them. Counted as the instances count (prompt tokens of whole blocks found, at most the
    blocks before the prompt's last token); an answer's KV is cached but for its last token (never
    computed), as bench's ideal hit rate counts it."""
    capacity = args.hbm_tokens // args.block
    caches: list[OrderedDict[int, None]] = [OrderedDict() for _ in range(args.instances)]
    history: list[list[tuple[str, int, int, int]]] = [[] for _ in range(args.users)]
    system = [("s", 0, 0, i) for i in range(args.system_tokens)]
    hit = asked = 0

    def keys(tokens: list[tuple[str, int, int, int]]) -> list[int]:
        out, key = [], 0
        for b in range(len(tokens) // args.block):
            key = hash((key, tuple(tokens[b * args.block : (b + 1) * args.block])))
            out.append(key)
        return out

    for r in range(args.rounds):
        for u in range(args.users):
            cache = caches[u % args.instances]
            question = [("q", u, r, i) for i in range(args.question_tokens)]
            prompt = system + history[u] + question
            asked += len(prompt)
            answer = [("a", u, r, i) for i in range(args.output_len)]
            chain = keys(prompt + answer[:-1])  # the prompt's blocks first
            found = 0
            for key in chain[: (len(prompt) - 1) // args.block]:
                if key not in cache:
                    break
                found += 1
            hit += found * args.block
            for key in chain:
                cache[key] = None
                cache.move_to_end(key)
                if len(cache) > capacity:
                    cache.popitem(last=False)
            history[u] = history[u] + question + answer
    return hit / asked


def start_sims(stack: ExitStack, tmp: Path, model: Path, ucm: Path, args: argparse.Namespace) -> list[str]:
    """The simulators, each publishing its KV-cache events (as vLLM with the plan's flag); their URLs."""
    gib = args.hbm_tokens * KV_BYTES_PER_TOKEN / 2**30
    flags = ("--profile", "medium-cpu", "--block-size", str(args.block), "--kv-cache-gib", f"{gib:.9f}",
             "--kv-transfer-config", kv_transfer_config(ucm))  # fmt: skip
    urls = []
    for port in args.event_ports:
        config = {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": f"tcp://*:{port}"}
        sim = sim_server(tmp, *flags, "--kv-events-config", json.dumps(config), model=str(model), timeout=60)
        urls.append(stack.enter_context(sim).url)
    return urls


def start_vllm(stack: ExitStack, tmp: Path, model: Path, ucm: Path, args: argparse.Namespace) -> list[str]:
    """Real vLLM servers on the CPU, each publishing its KV-cache events; their URLs."""
    from tests.support.vllm_server import VllmServer, start_together

    servers = []
    for n, port in enumerate(args.event_ports):
        events = {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": f"tcp://*:{port}"}
        servers.append(
            VllmServer(
                model=model,
                log_path=tmp / f"vllm-{n}.log",
                cache_root=tmp / "vllm-cache",
                ucm_config=ucm,
                dtype="float32",
                max_model_len=8192,
                eager=True,
                in_process_worker=True,
                extra_args=["--kv-events-config", json.dumps(events)],
            )
        )
        stack.callback(servers[-1].stop)
    start_together(*servers)
    return [s.url for s in servers]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--engine", choices=("sim", "vllm"), default="sim")
    ap.add_argument(
        "--workload", choices=("multi-turn", "trace", "unique"), default="multi-turn",
        help="trace: a Mooncake-format trace of shared prefixes (bench make-trace); unique: no reuse",
    )  # fmt: skip
    ap.add_argument("--requests", type=int, default=160, help="trace, unique: requests")
    ap.add_argument("--rate", type=float, default=4.0, help="trace, unique: requests/s")
    ap.add_argument("--input-len", type=int, default=2048, help="trace, unique: mean prompt length")
    ap.add_argument("--groups", type=int, default=8, help="trace: prefix groups")
    ap.add_argument("--users", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--system-tokens", type=int, default=512)
    ap.add_argument("--question-tokens", type=int, default=256)
    ap.add_argument("--output-len", type=int, default=32)
    ap.add_argument("--hbm-tokens", type=int, default=4096, help="sim: each instance's local prefix cache")
    ap.add_argument("--instances", type=int, default=None, help="default: 4 simulators, 2 vLLM servers")
    args = ap.parse_args()
    vllm = args.engine == "vllm"
    args.instances = args.instances or (2 if vllm else 4)
    args.block = VLLM_BLOCK if vllm else BLOCK
    args.event_ports = [free_port() for _ in range(args.instances)]
    policies = VLLM_POLICIES if vllm else POLICIES
    print("load average at start: {:.2f} {:.2f} {:.2f}".format(*os.getloadavg()), flush=True)
    (REPO / "build").mkdir(exist_ok=True)
    results: dict[str, dict] = {}
    with (
        tempfile.TemporaryDirectory(prefix="ucm-routing-", dir=REPO / "build") as tmp_name,
        ExitStack() as stack,
    ):
        tmp = Path(tmp_name)
        model, ucm = model_and_store(tmp)
        urls = (start_vllm if vllm else start_sims)(stack, tmp, model, ucm, args)
        for seed, (row, policy, follows, flags) in enumerate(policies, start=1):
            events = dict(zip(urls, args.event_ports, strict=True)) if follows else {}
            results[row] = run_policy(row, policy, flags, events, seed, urls, model, tmp, args)
            r = results[row]
            print(f"{row}: {r['completed']} done, {r['failed']} failed, TTFT mean {r['ttft_mean']:.0f} ms",
                  flush=True)  # fmt: skip
    report(results, args)


def report(results: dict[str, dict], args: argparse.Namespace) -> None:
    rr, ll = results["round-robin"], results["least-loaded"]
    engines = (
        f"{args.instances} mixed vLLM servers (tiny model, CPU, block {args.block}, one UCM store)"
        if args.engine == "vllm"
        else f"{args.instances} mixed simulators (medium-cpu profile, block {args.block}, local cache "
        f"{args.hbm_tokens} tokens each, one UCM store)"
    )
    print()
    load = (
        f"multi-turn: {args.users} users x {args.rounds} rounds, system {args.system_tokens}, question "
        f"{args.question_tokens}, answer {args.output_len} tokens"
        if args.workload == "multi-turn"
        else f"{args.workload} trace: {args.requests} requests at {args.rate}/s, prompts of {args.input_len} "
        f"tokens on average, answers {args.output_len}"
        + (f", {args.groups} prefix groups" if args.workload == "trace" else "")
    )
    print(f"{load}; {engines}")
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
    if args.workload == "multi-turn" and args.engine == "sim":
        oracle = pinned_oracle(args)
        print()
        print(f"oracle (conversations pinned, LRU per instance): local hit {100 * oracle:.1f}%; each row's "
              "local hit against it:")  # fmt: skip
        print("; ".join(f"{row} {r['local_hit'] / oracle:.2f}x" for row, r in results.items()))
    print()
    what = "rounds 2-R" if args.workload == "multi-turn" else "all"
    print(f"| policy | TTFT p50 of each round, ms | {what}: TTFT p50 ms | vs rr | vs ll |")
    print("|---|---|---|---|---|")
    for row, r in results.items():
        p50 = r["later_p50"] or float("nan")
        ratios = f"{p50 / (rr['later_p50'] or p50):.2f}x | {p50 / (ll['later_p50'] or p50):.2f}x"
        rounds = " / ".join(f"{x:.0f}" for x in r["round_p50s"] if x is not None)
        print(f"| {row} | {rounds} | {p50:.0f} | {ratios} |")
    for row, r in results.items():
        kv = r["routing"]
        if not str(kv.get("policy")).startswith("kv"):
            continue
        print()
        print(
            f"{row}: index {kv['index']}, {kv['blocks']} blocks; prefill {kv['prefill']}; load {kv['load']}"
        )
        if kv.get("kv_events"):
            print(f"  events: {json.dumps(kv['kv_events'])}")
        predicted = [kv.get("predicted", {}).get(u, {}).get("local", 0) for u in r["urls"]]
        print(f"  local hit tokens per instance: predicted {predicted}, counted {r['local_by_instance']}")


if __name__ == "__main__":
    main()
