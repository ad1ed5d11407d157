"""Summary statistics exactly as `vllm bench serve` computes them, under its key names.

Per successful request: TTFT, TPOT = (E2EL - TTFT) / (output tokens - 1) for outputs longer
than one token, every inter-token latency, and E2EL. Each is reported as mean, median, std
(population, numpy's default), p90 and p99, in milliseconds: `mean_ttft_ms`, `p99_tpot_ms`...
Throughputs divide by the phase's wall time, from the first send to the last answer. A metric
with no sample (every request failed; TPOT with one-token outputs) is None: null in JSON, `-` in
tables, never 0.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

import numpy as np

from ucmctl.bench.client import RequestResult

METRICS = ("ttft", "tpot", "itl", "e2el")
STATS = ("mean", "median", "std", "p90", "p99")
LABELS = {"ttft": "TTFT", "tpot": "TPOT", "itl": "ITL", "e2el": "E2EL"}


def _stats(name: str, values: Sequence[float]) -> dict[str, float | None]:
    """The five statistics in ms; None each when nothing was measured (never a made-up 0)."""
    if not len(values):
        return {f"{stat}_{name}_ms": None for stat in STATS}
    arr = np.asarray(values, dtype=np.float64) * 1000.0
    return {
        f"mean_{name}_ms": float(arr.mean()),
        f"median_{name}_ms": float(np.median(arr)),
        f"std_{name}_ms": float(arr.std()),
        f"p90_{name}_ms": float(np.percentile(arr, 90)),
        f"p99_{name}_ms": float(np.percentile(arr, 99)),
    }


def summarize(results: Sequence[RequestResult], duration: float) -> dict[str, Any]:
    """The phase's figures: counts, throughputs and the four latency metrics."""
    ok = [r for r in results if r.ok]
    ttfts = [r.ttft for r in ok]
    e2els = [r.latency for r in ok]
    tpots = [(r.latency - r.ttft) / (r.output_tokens - 1) for r in ok if r.output_tokens > 1]
    itls = [x for r in ok for x in r.itl]
    total_in = sum(r.prompt_len for r in ok)
    total_out = sum(r.output_tokens for r in ok)
    cached = [r.cached_tokens or 0 for r in ok]
    dur = duration if duration > 0 else float("nan")
    out: dict[str, Any] = {
        "duration": duration,
        "completed": len(ok),
        "failed": len(results) - len(ok),
        "total_input_tokens": total_in,
        "total_output_tokens": total_out,
        "request_throughput": len(ok) / dur,
        "output_throughput": total_out / dur,
        "total_token_throughput": (total_in + total_out) / dur,
        # What the server said it served from a cache (usage.prompt_tokens_details), when it says.
        "usage_cached_tokens": int(sum(cached)),
    }
    for name, values in (("ttft", ttfts), ("tpot", tpots), ("itl", itls), ("e2el", e2els)):
        out.update(_stats(name, values))
    errors = Counter(r.error for r in results if not r.ok)
    out["errors"] = [{"error": e, "count": n} for e, n in errors.most_common(10)]
    return out
