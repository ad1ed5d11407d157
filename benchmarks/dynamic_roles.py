"""Roles per request measured: a load whose mix shifts (long prompts with short answers, then
short prompts with long answers) through four simulator instances, split 1P3D, 2P2D and 3P1D
with fixed roles, and with `--roles dynamic` (each request whole on the instance of either side
picked for its prompt), one run.

    python benchmarks/dynamic_roles.py [--prompts 40] [--rate-a 2] [--rate-b 4] [--seed 1]
                                       [--slo "ttft:3000 tpot:150"]

Four `ucmctl sim serve` instances with the calibrated profile of the real CPU vLLM (`medium-cpu`),
block 16, one UCM store (`Cache|Posix`) for all four; for each row a proxy (`ucmctl proxy --mode
pd`, least-loaded) and two `ucmctl bench` runs against it in a row: phase A, --prompts prompts of
--input-a tokens answered with --output-a at --rate-a requests/s; phase B, --input-b tokens
answered with --output-b at --rate-b: every row the same prompts at the same times (one seed a
phase), none finding another row's blocks (each `bench` run salts its prompts: vLLM's
`cache_salt`). A last row, for reference, is no split at all: the four in mixed mode, every
request whole on one. The figure is goodput (requests/s that met every SLO of --slo, over both
phases' wall time) against the best fixed split's.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from contextlib import ExitStack
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.support import bench_cli
from tests.support.processes import sim_server
from tests.support.proxy_rig import model_and_store, start_proxy
from tests.support.vllm_server import kv_transfer_config

REPO = Path(__file__).resolve().parents[1]
BLOCK = 16
ROWS = (
    ("1P3D", 1, "fixed"),
    ("2P2D", 2, "fixed"),
    ("3P1D", 3, "fixed"),
    ("dynamic (2P2D declared)", 2, "dynamic"),
    ("mixed (all four, no roles)", 0, "mixed"),  # a reference, not a split: every request whole
)


def start_pd_proxy(
    prefill: list[str], decode: list[str], roles: str, log: Path
) -> tuple[subprocess.Popen[bytes], str]:
    if roles == "mixed":
        return start_proxy(["--mode", "mixed", "--health-interval", "0.5",
                            *(x for u in decode for x in ("--instance", u))], log)  # fmt: skip
    argv = ["--mode", "pd", "--roles", roles, "--health-interval", "0.5"]
    argv += [x for u in prefill for x in ("--prefiller", u)] + [x for u in decode for x in ("--decoder", u)]
    return start_proxy(argv, log)


def phase(url: str, model: Path, out: Path, seed: int, input_len: int, output_len: int, rate: float,
          args: argparse.Namespace) -> dict:  # fmt: skip
    doc = bench_cli.bench_json(
        url, model, out, "--prefix-ratio", "0", "--input-len", str(input_len), "--output-len",
        str(output_len), "--num-prompts", str(args.prompts), "--request-rate", str(rate), "--seed", str(seed),
        "--goodput", args.slo,
    )  # fmt: skip
    (cell,) = doc["cells"]
    m = cell["measure"]
    keys = {"good": "good_completed", "done": "completed", "failed": "failed", "duration": "duration",
            "ttft_p50": "median_ttft_ms", "tpot_p50": "median_tpot_ms"}  # fmt: skip
    return {**{k: m[key] for k, key in keys.items()}, "paths": m.get("paths")}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--prompts", type=int, default=40)
    ap.add_argument("--input-a", type=int, default=2048)
    ap.add_argument("--output-a", type=int, default=16)
    ap.add_argument("--rate-a", type=float, default=2.0)
    ap.add_argument("--input-b", type=int, default=128)
    ap.add_argument("--output-b", type=int, default=256)
    ap.add_argument("--rate-b", type=float, default=4.0)
    ap.add_argument("--slo", default="ttft:3000 tpot:150", help="goodput's SLOs, ms")
    ap.add_argument("--seed", type=int, default=1, help="the load's: phase A's seed 2N-1, phase B's 2N")
    ap.add_argument("--rows", default="", help="only the rows whose names start with these (comma-separated)")
    args = ap.parse_args()
    print("load average at start: {:.2f} {:.2f} {:.2f}".format(*os.getloadavg()), flush=True)
    (REPO / "build").mkdir(exist_ok=True)
    results: dict[str, list[dict]] = {}
    with (
        tempfile.TemporaryDirectory(prefix="ucm-roles-", dir=REPO / "build") as tmp_name,
        ExitStack() as stack,
    ):
        tmp = Path(tmp_name)
        model, ucm = model_and_store(tmp)
        flags = ("--profile", "medium-cpu", "--block-size", str(BLOCK), "--kv-transfer-config",
                 kv_transfer_config(ucm))  # fmt: skip
        urls = [
            stack.enter_context(sim_server(tmp, *flags, model=str(model), timeout=60)).url for _ in range(4)
        ]
        for seed, (name, prefills, roles) in enumerate(ROWS, start=1):
            if args.rows and not name.startswith(tuple(args.rows.split(","))):
                continue
            proc, url = start_pd_proxy(urls[:prefills], urls[prefills:], roles, tmp / f"proxy-{seed}.log")
            try:
                a = phase(
                    url,
                    model,
                    tmp / f"{seed}-a.json",
                    2 * args.seed - 1,
                    args.input_a,
                    args.output_a,
                    args.rate_a,
                    args,
                )
                b = phase(url, model, tmp / f"{seed}-b.json", 2 * args.seed, args.input_b, args.output_b,
                          args.rate_b, args)  # fmt: skip
            finally:
                proc.kill()
                proc.wait()
            results[name] = [a, b]
            print(f"{name}: A {a}, B {b}", flush=True)
    report(results, args)


def goodput(phases: list[dict]) -> float:
    return sum(p["good"] for p in phases) / sum(p["duration"] for p in phases)


def report(results: dict[str, list[dict]], args: argparse.Namespace) -> None:
    splits = {name for name, _, roles in ROWS if roles == "fixed"}
    fixed = [goodput(v) for k, v in results.items() if k in splits]
    best = max(fixed, default=float("nan"))
    print()
    print(
        f"phase A: {args.prompts} prompts of {args.input_a} tokens, {args.output_a} out, {args.rate_a}/s; "
        f"phase B: {args.prompts} of {args.input_b}, {args.output_b} out, {args.rate_b}/s; "
        f"SLO {args.slo} ms; 4 simulators (medium-cpu, block {BLOCK}, one UCM store)"
    )
    print()
    cols = ("split", "A: good / done", "A: TTFT p50 ms", "A: TPOT p50 ms", "B: good / done", "B: TTFT p50 ms",
            "B: TPOT p50 ms", "goodput req/s", "vs best fixed")  # fmt: skip
    print("| " + " | ".join(cols) + " |")
    print("|" + "---|" * len(cols))
    for name, (a, b) in results.items():
        g = goodput([a, b])
        print(
            f"| {name} | {a['good']} / {a['done']} | {a['ttft_p50']:.0f} | {a['tpot_p50']:.1f} | "
            f"{b['good']} / {b['done']} | {b['ttft_p50']:.0f} | {b['tpot_p50']:.1f} | {g:.3f} | "
            f"{g / best:.2f}x |"
        )


if __name__ == "__main__":
    main()
