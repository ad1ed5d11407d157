"""Selective disaggregation measured: the same multi-turn load through a 2P2D deployment of
simulators, always disaggregated (every request a prefill leg, then decode) and with
`--direct-below N` for several N (a request whose tokens not cached on the chosen decode
instance, in its own cache or the store, are fewer than N goes to that instance alone, which
prefills them itself), one run.

    python benchmarks/disaggregation.py [--users 16] [--rounds 4] [--system-tokens 512]
                                        [--question-tokens 256] [--output-len 64]
                                        [--direct-below 128,256,512,1024]

Two prefill and two decode `ucmctl sim serve` instances, the calibrated profile of the real CPU
vLLM (`medium-cpu`), block 16, one UCM store (`Cache|Posix`) for all four, each publishing its
KV-cache events; for each row a proxy (`ucmctl proxy --mode pd --routing kv`, following the
events, as `up` starts it for `routing: kv`) and `ucmctl bench --workload multi-turn` (every
user's rounds in turn, the users at once; a prompt seed per row, so no row finds another's blocks
in the store). The figures, from the saved results: each round's TTFT p50 and the later rounds'
(where the history is cached) against always-disaggregated, the worst round's TPOT p99 against
it, and how many requests took each path (the proxy's own counter).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import urllib.request
from contextlib import ExitStack
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.support import bench_cli
from tests.support.processes import free_port, sim_server
from tests.support.proxy_rig import model_and_store, start_proxy
from tests.support.vllm_server import kv_transfer_config

REPO = Path(__file__).resolve().parents[1]
BLOCK = 16
PATHS = "ucmctl_proxy_requests_by_path_total"


def scrape(url: str, name: str) -> dict[str, float]:
    """A counter's samples by their label text."""
    text = urllib.request.urlopen(url + "/metrics", timeout=10).read().decode()
    return {
        line.split("{", 1)[1].split("}", 1)[0]: float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith(name + "{")
    }


def start_pd_proxy(
    prefill: list[str], decode: list[str], ports: dict[str, int], flags: list[str], log: Path
) -> tuple[subprocess.Popen[bytes], str]:
    argv = ["--mode", "pd", "--routing", "kv", "--block-size", str(BLOCK), "--served-model", "sim-model",
            "--health-interval", "0.5", *flags]  # fmt: skip
    for role, urls in (("--prefiller", prefill), ("--decoder", decode)):
        for u in urls:
            argv += [role, u, "--kv-events", f"{u}=tcp://127.0.0.1:{ports[u]}"]
    return start_proxy(argv, log)


def run_row(name: str, flags: list[str], seed: int, sims: tuple[list[str], list[str]], ports: dict[str, int],
            model: Path, tmp: Path, args: argparse.Namespace) -> dict:  # fmt: skip
    proc, url = start_pd_proxy(*sims, ports, flags, tmp / f"proxy-{name}.log")
    try:
        doc = bench_cli.bench_json(
            url, model, tmp / f"{name}.json", "--workload", "multi-turn", "--users", str(args.users),
            "--rounds", str(args.rounds), "--system-tokens", str(args.system_tokens), "--question-tokens",
            str(args.question_tokens), "--output-len", str(args.output_len), "--seed", str(seed),
            "--request-rate", str(args.request_rate),
        )  # fmt: skip
        paths = scrape(url, PATHS)
    finally:
        proc.kill()
        proc.wait()
    rounds = [c["measure"] for c in doc["cells"] if c.get("round") is not None]
    later = next((c["measure"] for c in doc["cells"] if c.get("aggregate")), None)  # rounds 2..R
    return {
        "completed": sum(p["completed"] for p in rounds),
        "failed": sum(p["failed"] for p in rounds),
        "p50s": [p["median_ttft_ms"] for p in rounds],
        "later_p50": later["median_ttft_ms"] if later else None,
        "later_p99": later["p99_ttft_ms"] if later else None,
        "tpot_p99": max(p["p99_tpot_ms"] for p in rounds),
        "paths": {k.split('"')[1]: int(v) for k, v in paths.items()},
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--users", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--system-tokens", type=int, default=512)
    ap.add_argument("--question-tokens", type=int, default=256)
    ap.add_argument("--output-len", type=int, default=64)
    ap.add_argument("--request-rate", default="inf", help="each round's requests per second (inf: at once)")
    ap.add_argument(
        "--direct-below", default="128,256,512,1024", help="thresholds to measure, comma-separated"
    )
    args = ap.parse_args()
    thresholds = [int(x) for x in args.direct_below.split(",") if x]
    rows = [("always disaggregated", [])] + [
        (f"direct below {n}", ["--direct-below", str(n)]) for n in thresholds
    ]
    print("load average at start: {:.2f} {:.2f} {:.2f}".format(*os.getloadavg()), flush=True)
    (REPO / "build").mkdir(exist_ok=True)
    results: dict[str, dict] = {}
    with (
        tempfile.TemporaryDirectory(prefix="ucm-disagg-", dir=REPO / "build") as tmp_name,
        ExitStack() as stack,
    ):
        tmp = Path(tmp_name)
        model, ucm = model_and_store(tmp)
        flags = ("--profile", "medium-cpu", "--block-size", str(BLOCK), "--kv-transfer-config",
                 kv_transfer_config(ucm))  # fmt: skip
        ports: dict[str, int] = {}
        sims: tuple[list[str], list[str]] = ([], [])
        for side in sims:
            for _ in range(2):
                port = free_port()
                events = {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": f"tcp://*:{port}"}
                served = sim_server(tmp, *flags, "--kv-events-config", json.dumps(events), model=str(model),
                                    timeout=60)  # fmt: skip
                side.append(stack.enter_context(served).url)
                ports[side[-1]] = port
        for seed, (name, row_flags) in enumerate(rows, start=1):
            results[name] = r = run_row(
                name.replace(" ", "-"), row_flags, seed, sims, ports, model, tmp, args
            )
            print(f"{name}: {r['completed']} done, {r['failed']} failed, paths {r['paths']}", flush=True)
    report(results, args)


def report(results: dict[str, dict], args: argparse.Namespace) -> None:
    base = results["always disaggregated"]
    print()
    print(
        f"multi-turn: {args.users} users x {args.rounds} rounds, system {args.system_tokens}, question "
        f"{args.question_tokens}, answer {args.output_len} tokens; 2P2D simulators (medium-cpu, block "
        f"{BLOCK}, one UCM store), kv routing; each round's requests at {args.request_rate}/s"
    )
    print()
    cols = ("row", "TTFT p50 per round, ms", "rounds 2-R: TTFT p50 ms", "vs always", "TTFT p99 ms",
            "worst round's TPOT p99 ms", "vs always", "direct (prefill busy) / disaggregated")  # fmt: skip
    print("| " + " | ".join(cols) + " |")
    print("|" + "---|" * len(cols))
    for name, r in results.items():
        direct = r["paths"].get("direct", 0) + r["paths"].get("direct_saturated", 0)
        paths = (
            f"{direct} ({r['paths'].get('direct_saturated', 0)} busy) / {r['paths'].get('disaggregated', 0)}"
        )
        later = f"{r['later_p50']:.0f} | {r['later_p50'] / base['later_p50']:.2f}x | {r['later_p99']:.0f}"
        print(
            f"| {name} | {' / '.join(f'{x:.0f}' for x in r['p50s'])} | {later} | "
            f"{r['tpot_p99']:.1f} | {r['tpot_p99'] / base['tpot_p99']:.2f}x | {paths} |"
        )


if __name__ == "__main__":
    main()
