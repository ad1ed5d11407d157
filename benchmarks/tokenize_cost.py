"""What exact tokenization costs a text request routed by `kv`: the same text prompts through
two `kv` proxies in front of one simulator, one asking the simulator's /tokenize for each
prompt's token ids (the default) and one estimating them from the text (--no-tokenize).

    python benchmarks/tokenize_cost.py [--words 1500] [--requests 100] [--rounds 5]

One zero-cost `ucmctl sim serve` of the tiny model (its byte-level BPE tokenizer file, as vLLM
would load it), so a request's time is the proxy's and the servers' handling, not a model's.
Each round sends --requests text completions (max_tokens 1, not streamed, a new prompt each)
one at a time through each proxy in turn; the figure is the median request time, per proxy, the
median over rounds, and the difference: what the /tokenize round trip adds to a request. The
simulator's tokenizer is the same `tokenizers` library vLLM's fast tokenizers are; vLLM's own
/tokenize path (its renderer, chat template) costs more than this and is not measured here.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.support.processes import sim_server
from tests.support.proxy_rig import start_proxy

REPO = Path(__file__).resolve().parents[1]


def kv_proxy(instance: str, flags: list[str], log: Path) -> tuple[subprocess.Popen[bytes], str]:
    return start_proxy(["--mode", "mixed", "--routing", "kv", "--instance", instance, *flags], log)


def timed(url: str, prompt: str) -> float:
    body = json.dumps({"model": "sim-model", "prompt": prompt, "max_tokens": 1}).encode()
    req = urllib.request.Request(
        url + "/v1/completions", data=body, headers={"Content-Type": "application/json"}
    )
    t = time.perf_counter()
    with urllib.request.urlopen(req, timeout=60) as r:
        r.read()
    return time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--words", type=int, default=1500)
    ap.add_argument("--requests", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    print("load average at start: {:.2f} {:.2f} {:.2f}".format(*os.getloadavg()), flush=True)
    (REPO / "build").mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="ucm-tokenize-", dir=REPO / "build") as tmp_name:
        tmp = Path(tmp_name)
        from ucmctl.tinymodel import make_model

        model = make_model(tmp / "tiny", size="tiny", seed=0)
        flags = ("--profile", "zero", "--max-model-len", "32768", "--served-model-name", "sim-model")
        with sim_server(tmp, *flags, model=str(model)) as sim:
            words = " ".join(f"word{(n * 7919) % 5003}" for n in range(args.words))
            tokens = json.loads(
                urllib.request.urlopen(
                    urllib.request.Request(
                        sim.url + "/tokenize",
                        data=json.dumps({"prompt": words}).encode(),
                        headers={"Content-Type": "application/json"},
                    ),
                    timeout=30,
                ).read()
            )["count"]
            procs = []
            try:
                exact, px = kv_proxy(sim.url, [], tmp / "exact.log")
                procs.append(exact)
                estimating, py = kv_proxy(sim.url, ["--no-tokenize"], tmp / "estimating.log")
                procs.append(estimating)
                medians: dict[str, list[float]] = {"tokenize": [], "no-tokenize": []}
                n = 0
                for _ in range(args.rounds):
                    for name, url in (("tokenize", px), ("no-tokenize", py)):
                        times = []
                        for _ in range(args.requests):
                            n += 1
                            times.append(timed(url, f"request{n} {words}"))
                        medians[name].append(statistics.median(times))
                routing = json.loads(urllib.request.urlopen(px + "/routing", timeout=5).read())
            finally:
                for p in procs:
                    p.kill()
                    p.wait()
    a, b = statistics.median(medians["tokenize"]), statistics.median(medians["no-tokenize"])
    print()
    print(
        f"text prompts of {tokens} tokens ({len(words)} characters), {args.requests} requests x "
        f"{args.rounds} rounds"
    )
    print()
    print("| proxy | request time p50 (median of rounds) | rounds |")
    print("|---|---|---|")
    for name, value in (("kv, /tokenize (default)", a), ("kv, --no-tokenize", b)):
        key = "tokenize" if "no-" not in name else "no-tokenize"
        print(f"| {name} | {1e3 * value:.2f} ms | {', '.join(f'{1e3 * x:.2f}' for x in medians[key])} |")
    print()
    print(
        f"added by /tokenize: {1e3 * (a - b):.2f} ms a request ({a / b:.2f}x); "
        f"tokenization {routing['tokenization']}"
    )


if __name__ == "__main__":
    main()
