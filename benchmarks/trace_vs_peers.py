"""Trace replay against a peer tool: `ucmctl bench --workload trace` and aiperf 0.13
(`aiperf profile --custom-dataset-type mooncake_trace --fixed-schedule`) replay the same
synthetic trace on the same simulator.

    python benchmarks/trace_vs_peers.py [--rounds 2] [--requests 60] [--rate 1]
        [--capacity-streams 256] [--capacity-rounds 3]

(a) Accuracy (target: TTFT and TPOT means within 10 % of aiperf's): one simulator with the
    calibrated `medium-cpu` profile (block 16, prefix caching on), a shared-prefix trace from
    `ucmctl bench make-trace` replayed on its timestamps; rounds alternate the two tools, and the
    server's prefix cache is reset before each run so both start cold. The server's own counters
    (prompt and generated tokens, prefix-cache hits) are read around every run: both tools must
    have sent the trace's exact token counts. aiperf builds its own prompt text from the hash ids
    and the local tokenizer; its TPOT is `inter_token_latency` with `--use-server-token-count`
    (vLLM's definition: (latency - TTFT) / (output tokens - 1), per request, averaged).
(b) Capacity (target: ucmctl's streamed output tokens/s >= 1.0x aiperf's): one zero-cost
    simulator, a trace of short prompts and long answers, back to back at --capacity-streams in
    flight (ucmctl `--back-to-back --concurrency N`; aiperf `--concurrency N --no-fixed-schedule`),
    --capacity-rounds alternating rounds, median of each. Each round also prints the CPU seconds
    each client used (its whole run, start-up included; aiperf's worker processes included) and
    the simulator's CPU seconds meanwhile: with the simulator near one full core for the whole
    run, both clients are server-bound and the ratio measures the server, not the client.

    python benchmarks/trace_vs_peers.py --skip-accuracy   # (b) only; --skip-capacity: (a) only

aiperf is installed into its own venv outside the repository (/tmp/peers-venv, `pip install
aiperf==0.13.*`) when missing. Its tokenizer workers load tokenizers in offline mode through
`snapshot_download`, which refuses a local folder path (HFValidationError "Repo id must be in the
form 'repo_name'..."), so the local model's tokenizer is laid out as a Hugging Face cache entry
`local/medium` under /tmp/peers-hf and aiperf runs with HF_HUB_OFFLINE=1.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.support import bench_cli
from tests.support.processes import sim_server

REPO = Path(__file__).resolve().parents[1]
UCMCTL = [sys.executable, "-m", "ucmctl"]
PEERS_VENV = Path(os.environ.get("PEERS_VENV", "/tmp/peers-venv"))
HF_CACHE = Path("/tmp/peers-hf/hub")
COUNTERS = (
    "prompt_tokens_total",
    "generation_tokens_total",
    "prefix_cache_hits_total",
    "prefix_cache_queries_total",
)


def ensure_aiperf() -> Path:
    exe = PEERS_VENV / "bin" / "aiperf"
    if not exe.exists():
        print(f"installing aiperf==0.13.* into {PEERS_VENV} ...", flush=True)
        subprocess.run([sys.executable, "-m", "venv", str(PEERS_VENV)], check=True)
        done = subprocess.run(
            [str(PEERS_VENV / "bin" / "pip"), "install", "-q", "aiperf==0.13.*"],
            capture_output=True,
            text=True,
        )
        if done.returncode != 0 or not exe.exists():
            raise SystemExit(f"aiperf could not be installed: {done.stderr[-2000:]}")
    return exe


def hf_cache_tokenizer(model_dir: Path) -> str:
    """The model folder's tokenizer as the Hugging Face cache entry `local/<name>`."""
    repo = f"local/{model_dir.name}"
    entry = HF_CACHE / f"models--local--{model_dir.name}"
    rev = "0" * 40
    snap = entry / "snapshots" / rev
    snap.mkdir(parents=True, exist_ok=True)
    for f in model_dir.iterdir():
        if f.name.startswith("tokenizer") or f.name in ("config.json", "special_tokens_map.json"):
            shutil.copy2(f, snap / f.name)
    (entry / "refs").mkdir(exist_ok=True)
    (entry / "refs" / "main").write_text(rev)
    return repo


def counters(url: str) -> dict[str, float]:
    text = urllib.request.urlopen(f"{url}/metrics", timeout=10).read().decode()
    out = {}
    for name in COUNTERS:
        m = re.search(rf"^vllm:{name}\{{[^}}]*\}} (\S+)$", text, re.M)
        out[name] = float(m.group(1)) if m else 0.0
    return out


def reset_cache(url: str) -> None:
    req = urllib.request.Request(f"{url}/reset_prefix_cache", data=b"{}", method="POST")
    urllib.request.urlopen(req, timeout=10).read()


make_trace = bench_cli.make_trace


def trace_totals(path: Path) -> tuple[int, int, int]:
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return len(rows), sum(r["input_length"] for r in rows), sum(r["output_length"] for r in rows)


def ours(url: str, model_dir: Path, trace: Path, seed: int, out: Path, extra: tuple[str, ...] = ()) -> dict:
    args = ("--workload", "trace", "--trace", str(trace), "--seed", str(seed), *extra)
    doc = bench_cli.bench_json(url, model_dir, out, *args)
    m = doc["cells"][0]["measure"]
    return {
        "ttft": m["mean_ttft_ms"],
        "tpot": m["mean_tpot_ms"],
        "tok_s": m["output_throughput"],
        "ok": m["completed"],
        "failed": m["failed"],
        "lag_p99": m["send_lag_ms"]["p99"],
    }


def theirs(
    aiperf: Path,
    url: str,
    model_dir: Path,
    tokenizer: str,
    trace: Path,
    seed: int,
    out: Path,
    extra: tuple[str, ...],
) -> dict:
    cmd = [
        str(aiperf),
        "profile",
        "--model",
        str(model_dir),
        "--url",
        url,
        "--endpoint-type",
        "completions",
        "--streaming",
        "--tokenizer",
        tokenizer,
        "--input-file",
        str(trace),
        "--custom-dataset-type",
        "mooncake_trace",
        "--extra-inputs",
        "ignore_eos:true",
        "--use-server-token-count",
        "--random-seed",
        str(seed),
        "--ui-type",
        "none",
        "--output-artifact-dir",
        str(out),
        *extra,
    ]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_HUB_CACHE": str(HF_CACHE)}
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=env, cwd=out.parent)
    if done.returncode != 0:
        raise RuntimeError(f"aiperf failed ({done.returncode}): {' '.join(cmd)}\n{done.stdout[-3000:]}")
    d = json.loads((out / "profile_export_aiperf.json").read_text())
    count = d.get("request_count", {}).get("avg")
    return {
        "ttft": d["time_to_first_token"]["avg"],
        "tpot": d["inter_token_latency"]["avg"],
        "tok_s": d["output_token_throughput"]["avg"],
        "ok": count,
        "failed": (d.get("error_request_count") or {}).get("avg", 0),
        "lag_p99": (d.get("replay_sched_lag_p99") or {}).get("avg"),
    }


def children_cpu() -> float:
    """CPU seconds of this script's finished children (a tool run and every process it waited for)."""
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def proc_cpu(pid: int) -> float:
    """CPU seconds a running process (the simulator) has used so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def delta(a: dict[str, float], b: dict[str, float]) -> dict[str, float]:
    return {k: b[k] - a[k] for k in a}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--requests", type=int, default=60)
    ap.add_argument("--rate", type=float, default=1.0)
    ap.add_argument("--input-len", type=int, default=1024)
    ap.add_argument("--output-len", type=int, default=64)
    ap.add_argument("--profile", default="medium-cpu")
    ap.add_argument("--capacity-streams", type=int, default=256)
    ap.add_argument("--capacity-requests", type=int, default=512)
    ap.add_argument("--capacity-output-len", type=int, default=500)
    ap.add_argument("--model-dir", type=Path, default=REPO / ".models" / "medium")
    ap.add_argument("--skip-capacity", action="store_true")
    ap.add_argument("--skip-accuracy", action="store_true")
    ap.add_argument("--capacity-rounds", type=int, default=3)
    args = ap.parse_args()
    print("load average at start: {:.2f} {:.2f} {:.2f}".format(*os.getloadavg()), flush=True)
    model_dir = args.model_dir.resolve()
    aiperf = ensure_aiperf()
    tokenizer = hf_cache_tokenizer(model_dir)

    with tempfile.TemporaryDirectory(prefix="ucm-peers-") as tmp_name:
        tmp = Path(tmp_name)
        if not args.skip_accuracy:
            accuracy(args, aiperf, model_dir, tokenizer, tmp)
        if not args.skip_capacity:
            capacity(args, aiperf, model_dir, tokenizer, tmp)


def accuracy(args: argparse.Namespace, aiperf: Path, model_dir: Path, tokenizer: str, tmp: Path) -> None:
    trace = tmp / "trace.jsonl"
    print(
        make_trace(
            trace,
            "--requests",
            str(args.requests),
            "--rate",
            str(args.rate),
            "--input-len",
            str(args.input_len),
            "--output-len",
            str(args.output_len),
            "--pattern",
            "shared-prefix",
            "--groups",
            "4",
            "--shared-fraction",
            "0.5",
            "--seed",
            "0",
        )
    )
    n, tin, tout = trace_totals(trace)
    mine: list[dict] = []
    ref: list[dict] = []
    flags = ("--profile", args.profile, "--max-num-seqs", "256")
    with sim_server(tmp, *flags, model=str(model_dir), timeout=60) as srv:
        for r in range(args.rounds):
            for tool in ("ucmctl", "aiperf"):
                reset_cache(srv.url)
                before = counters(srv.url)
                if tool == "ucmctl":
                    res = ours(srv.url, model_dir, trace, seed=10 + r, out=tmp / f"ours-{r}.json")
                else:
                    res = theirs(
                        aiperf,
                        srv.url,
                        model_dir,
                        tokenizer,
                        trace,
                        20 + r,
                        tmp / f"aiperf-{r}",
                        ("--fixed-schedule",),
                    )
                d = delta(before, counters(srv.url))
                hit = d["prefix_cache_hits_total"] / max(1.0, d["prefix_cache_queries_total"])
                (mine if tool == "ucmctl" else ref).append(res)
                lag = "-" if res["lag_p99"] is None else f"{res['lag_p99']:.2f}"
                print(
                    f"round {r + 1} {tool:<6}: TTFT {res['ttft']:8.2f} ms, TPOT {res['tpot']:6.2f} ms, "
                    f"{res['ok']} ok / {res['failed']} failed; "
                    f"server saw {d['prompt_tokens_total']:.0f} "
                    f"prompt + {d['generation_tokens_total']:.0f} generated tokens "
                    f"(trace: {tin} + {tout}), "
                    f"prefix hit {100 * hit:.1f}%; send lag p99 {lag} ms",
                    flush=True,
                )
    print(
        f"(a) {n} requests at {args.rate:g}/s, ~{args.input_len} in / ~{args.output_len} out, "
        f"shared-prefix (4 groups, 0.5); simulator profile {args.profile}; "
        f"medians over {args.rounds} rounds"
    )
    for key, name in (("ttft", "mean TTFT"), ("tpot", "mean TPOT")):
        a, b = statistics.median(m[key] for m in mine), statistics.median(v[key] for v in ref)
        ok = "met" if abs(a / b - 1) <= 0.10 else "NOT met"
        print(
            f"{name:<10} ucmctl {a:9.2f} ms  aiperf {b:9.2f} ms  ratio {a / b:.3f} (target within 10%: {ok})"
        )


def capacity(args: argparse.Namespace, aiperf: Path, model_dir: Path, tokenizer: str, tmp: Path) -> None:
    cap = tmp / "capacity.jsonl"
    print(
        make_trace(
            cap,
            "--requests",
            str(args.capacity_requests),
            "--rate",
            "inf",
            "--input-len",
            "64",
            "--output-len",
            str(args.capacity_output_len),
            "--pattern",
            "unique",
            "--seed",
            "1",
        )
    )
    n, _, tout = trace_totals(cap)
    c = args.capacity_streams
    flags = ("--profile", "zero", "--max-num-seqs", str(c), "--no-enable-prefix-caching")
    with sim_server(tmp, *flags, model=str(model_dir), timeout=60) as srv:
        mine_t, ref_t = [], []
        for r in range(args.capacity_rounds):
            before, cpu0, sim0 = counters(srv.url), children_cpu(), proc_cpu(srv.process.pid)
            a = ours(
                srv.url,
                model_dir,
                cap,
                30 + r,
                tmp / f"cap-ours-{r}.json",
                ("--back-to-back", "--concurrency", str(c)),
            )
            da = delta(before, counters(srv.url))
            a_cpu, a_sim = children_cpu() - cpu0, proc_cpu(srv.process.pid) - sim0
            before, cpu0, sim0 = counters(srv.url), children_cpu(), proc_cpu(srv.process.pid)
            b = theirs(
                aiperf,
                srv.url,
                model_dir,
                tokenizer,
                cap,
                40 + r,
                tmp / f"cap-aiperf-{r}",
                ("--no-fixed-schedule", "--concurrency", str(c), "--request-count", str(n)),
            )
            db = delta(before, counters(srv.url))
            b_cpu, b_sim = children_cpu() - cpu0, proc_cpu(srv.process.pid) - sim0
            mine_t.append(a["tok_s"])
            ref_t.append(b["tok_s"])
            print(
                f"round {r + 1}: ucmctl {a['tok_s']:,.0f} tok/s ({a['ok']} ok, server "
                f"{da['generation_tokens_total']:.0f} generated), aiperf {b['tok_s']:,.0f} tok/s "
                f"({b['ok']} ok, server {db['generation_tokens_total']:.0f} generated; trace {tout}); "
                f"client CPU (whole process, start-up included) ucmctl {a_cpu:.1f} s, "
                f"aiperf {b_cpu:.1f} s; "
                f"simulator CPU during each {a_sim:.1f} s / {b_sim:.1f} s",
                flush=True,
            )
    a, b = statistics.median(mine_t), statistics.median(ref_t)
    print(
        f"(b) {n} requests, 64-token prompts, ~{args.capacity_output_len} out, "
        f"back to back at {c} in flight, "
        f"zero-cost simulator: ucmctl {a:,.0f} tok/s, aiperf {b:,.0f} tok/s -> ratio {a / b:.2f} "
        f"(target >= 1.0: {'met' if a >= b else 'NOT met'})"
    )


if __name__ == "__main__":
    main()
    print("load average at end: {:.2f} {:.2f} {:.2f}".format(*os.getloadavg()))
