"""Multi-turn hit rate through the UCM store: does `ucmctl bench --workload multi-turn` measure
an external hit rate within 3 points of the workload's ideal, round by round, when the store
holds every conversation and the local prefix cache does not?

    python benchmarks/multiturn_hits.py [--users 8] [--rounds 4] [--system-tokens 1024]
                                        [--question-tokens 128] [--output-len 64]

Three simulators in turn (zero-cost profile, block 16), the same workload (a fresh prompt seed
for each):

- store: the UCM store attached (`Cache|Posix` pipeline, a DRAM tier of --cache-gb and a store
  directory on disk, far larger than the workload) and the local prefix cache off
  (`--no-enable-prefix-caching`), so every hit must come from the store;
- store, concurrency 1: the same, one request at a time (every user's prompt reaches the
  server after the previous one is done, as the ideal assumes);
- no store: no connector, a small local prefix cache (--small-kv-tokens tokens of KV in all,
  running requests included) that cannot keep every conversation.

The reference, per round, is the ideal hit rate the run itself computes for an unbounded cache
(`ideal_hit_rate` in the saved JSON); the figure is measured - ideal, in points.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.support import bench_cli
from tests.support.processes import sim_server
from tests.support.vllm_server import kv_transfer_config, write_ucm_config

REPO = Path(__file__).resolve().parents[1]
BLOCK = 16
KV_BYTES_PER_TOKEN = 4096  # small blocks (64 KiB): the store's real I/O stays light on 2 cores


def multi_turn(
    url: str, model_dir: Path, args: argparse.Namespace, seed: int, out: Path, extra: tuple[str, ...] = ()
) -> list[dict]:
    doc = bench_cli.bench_json(
        url, model_dir, out, "--workload", "multi-turn", "--users", str(args.users), "--rounds",
        str(args.rounds), "--system-tokens", str(args.system_tokens), "--question-tokens",
        str(args.question_tokens), "--output-len", str(args.output_len), "--seed", str(seed), *extra,
    )  # fmt: skip
    cells: list[dict] = doc["cells"]
    return cells


def pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--users", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--system-tokens", type=int, default=1024)
    ap.add_argument("--question-tokens", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=64)
    ap.add_argument("--cache-gb", type=float, default=0.25, help="the store's DRAM tier")
    ap.add_argument("--small-kv-tokens", type=int, default=4096, help="no-store case: local KV, in tokens")
    ap.add_argument("--model-dir", type=Path, default=REPO / ".models" / "medium")
    args = ap.parse_args()
    print("load average at start: {:.2f} {:.2f} {:.2f}".format(*os.getloadavg()), flush=True)

    common = (
        "--profile",
        "zero",
        "--block-size",
        str(BLOCK),
        "--kv-bytes-per-token",
        str(KV_BYTES_PER_TOKEN),
    )
    results: dict[str, list[dict]] = {}
    with tempfile.TemporaryDirectory(prefix="ucm-multiturn-", dir=REPO / "build") as tmp_name:
        tmp = Path(tmp_name)
        store = tmp / "store"
        store.mkdir()
        ucm = write_ucm_config(tmp / "ucm.yaml", store, cache_gb=args.cache_gb)
        store_flags = (*common, "--no-enable-prefix-caching", "--kv-transfer-config", kv_transfer_config(ucm))
        small_gib = args.small_kv_tokens * KV_BYTES_PER_TOKEN / 2**30
        small_flags = (*common, "--kv-cache-gib", f"{small_gib:.9f}")
        cases = (
            ("store", store_flags, 1, ()),
            ("store c1", store_flags, 2, ("--concurrency", "1")),
            ("no store", small_flags, 3, ()),
        )
        for name, flags, seed, extra in cases:
            with sim_server(tmp, *flags, model=str(args.model_dir), timeout=60) as srv:
                results[name] = multi_turn(srv.url, args.model_dir, args, seed, tmp / f"{seed}.json", extra)
        store_files = sum(1 for p in store.rglob("*") if p.is_file())

    print(
        f"multi-turn: {args.users} users x {args.rounds} rounds, system {args.system_tokens}, "
        f"question {args.question_tokens}, answer {args.output_len} tokens; "
        f"zero-cost simulator, block {BLOCK}; "
        f"store: Cache|Posix ({args.cache_gb} GB DRAM tier, {store_files} block files written), "
        f"local prefix cache off; no store: local cache {args.small_kv_tokens} tokens"
    )
    print()
    print(
        "| round | ideal | store: external hit (- ideal) | store, concurrency 1: external hit (- ideal) | "
        "no store: local hit (- ideal) |"
    )
    print("|---|---|---|---|---|")
    gaps: dict[str, list[tuple[str, float]]] = {"store": [], "store c1": []}
    for a, c1, b in zip(results["store"], results["store c1"], results["no store"], strict=True):
        ideal = a["ideal_hit_rate"]
        row = [a["label"], pct(ideal)]
        for name, cell in (("store", a), ("store c1", c1), ("no store", b)):
            t = cell["measure"]["hit_rate"]["total"]
            assert abs(cell["ideal_hit_rate"] - ideal) < 0.02, "the runs' workloads differ"
            # With the local cache off every prompt token is an external query, so the external
            # hit rate is over the same tokens as the ideal.
            got = (t["external_hit_rate"] or 0.0) if name != "no store" else (t["local_hit_rate"] or 0.0)
            if name != "no store" and t["local_hit_rate"]:
                got = t["hit_rate"] or 0.0
            gap = got - cell["ideal_hit_rate"]
            if name in gaps:
                gaps[name].append((cell["label"], gap))
            note = ""
            m = cell["measure"]
            if m["failed"] or t.get("preemptions"):
                note = f" [{m['failed']} failed, {t.get('preemptions')} preempted]"
            row.append(f"{pct(got)} ({100 * gap:+.1f} pts){note}")
        print("| " + " | ".join(row) + " |")
    print()
    for name, label in (
        ("store", "store, one request per user at once"),
        ("store c1", "store, concurrency 1"),
    ):
        worst = max(abs(g) for _, g in gaps[name])
        later = max((abs(g) for lab, g in gaps[name] if lab != "round 1"), default=0.0)
        print(
            f"{label}: largest |external hit - ideal| {100 * worst:.1f} points over all rounds "
            f"({'met' if worst <= 0.03 else 'NOT met'}), {100 * later:.1f} points over rounds 2+ "
            f"({'met' if later <= 0.03 else 'NOT met'}); target within 3 points"
        )


if __name__ == "__main__":
    main()
    print("load average at end: {:.2f} {:.2f} {:.2f}".format(*os.getloadavg()))
