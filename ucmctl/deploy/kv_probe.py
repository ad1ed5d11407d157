"""After the health gate: one request through the proxy, and proof from the instances' own
counters that KV reached decode the way the deployment's mode promises.

A server that answers /health can still recompute every prompt (a P2P router that sends no
`transfer_id`, a store decode cannot read). The probe asks the engines what happened:

- p2p: decode's `vllm:prompt_tokens_by_source{source="external_kv_transfer"}` grew (vLLM 0.32
  and later; `vllm:external_prefix_cache_hits` on older versions);
- centralized: decode's `vllm:external_prefix_cache_hits` grew (the prefix prefill stored).

Counters are summed over every decode instance (the proxy picks one) and read from where ucmctl
runs, like the health gates.
"""

from __future__ import annotations

import json
import random
import time
import urllib.error
import urllib.request
from collections.abc import Callable

from pydantic import BaseModel

from ucmctl.core.exposition import samples
from ucmctl.core.store_errors import describe, errors_from_metrics
from ucmctl.engines import engine_for
from ucmctl.plan.model import Plan, Process

PROBE_TOKENS = 1100  # several whole blocks at any block size vLLM uses (16 .. 512)
MAX_TOKENS = 2
TOKEN_RANGE = (10, 500)  # ids every vocabulary has


class ProbeResult(BaseModel):
    """What `up` records and `status` shows."""

    mode: str
    ok: bool
    detail: str  # one line
    at: float


def applies(plan: Plan) -> str | None:
    """Why there is nothing to probe (mixed mode, no store in centralized mode), or None."""
    if plan.mode == "mixed":
        return "mixed mode: no KV moves between instances"
    if not any(p.role == "proxy" for p in plan.processes):
        return "no proxy to send the probe through"
    decode_stores = any(p.role == "decode" and plan.uses_store(p) for p in plan.processes)
    if plan.mode == "centralized" and not decode_stores:
        return "centralized mode without the UCM store: no KV path to prove"
    return None


def counter(text: str, name: str, label: str) -> float | None:
    """The sum of a counter's samples whose labels contain `label`; None when absent."""
    total, found = 0.0, False
    for s in samples(text, (name,)):
        if s.name == name and label in s.labels_text:
            total += s.value
            found = True
    return total if found else None


def _get(url: str, timeout: float) -> str:
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.read().decode(errors="replace")


def _post(url: str, body: dict, timeout: float) -> dict:
    req = urllib.request.Request(
        url, data=json.dumps(body).encode(), method="POST", headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


def _reading(plan: Plan, get: Callable[[str], str], decode: list[Process] | None = None) -> tuple[str, float]:
    """(metric used, its sum over the decode instances, or over those of `decode`)."""
    decodes = decode if decode is not None else [p for p in plan.processes if p.role == "decode"]
    texts = [get(f"{p.url}/metrics") for p in decodes]
    metrics = engine_for(plan.engine).metrics
    transfer = (metrics.prompt_tokens_by_source + "_total", f'source="{metrics.transfer_source}"')
    external_hits = (metrics.external_hits + "_total", "")
    wanted = [transfer, external_hits] if plan.mode == "p2p" else [external_hits]
    for name, label in wanted:
        values = [counter(t, name, label) for t in texts]
        if all(v is not None for v in values):
            return name + (f"{{{label}}}" if label else ""), sum(v for v in values if v is not None)
    raise ValueError(f"decode's /metrics has none of {', '.join(n for n, _ in wanted)}")


def _grown_reading(
    plan: Plan, get: Callable[[str], str], before: float, decode: list[Process] | None = None
) -> float:
    """The decode counter of `_reading` once it grew past `before`, or after 15 s: a counter
    moves when the engine logs its step's stats."""
    deadline = time.monotonic() + 15.0
    while True:
        _, after = _reading(plan, get, decode)
        if after > before or time.monotonic() > deadline:
            return after
        time.sleep(0.5)


def run_probe(plan: Plan, proxy: Process | None = None, *, timeout: float = 300.0) -> ProbeResult:
    """Send one request through the proxy (`proxy`: the one of several replicas); say whether
    KV reached decode."""
    proxy = proxy or next(p for p in plan.processes if p.role == "proxy")
    if proxy.proxy is not None and proxy.proxy.roles == "dynamic":
        return _probe_dynamic(plan, proxy, timeout)
    get = lambda url: _get(url, timeout=10.0)  # noqa: E731
    body, length, now = _probe_body(plan), probe_tokens(plan), time.time()
    errors_before = _store_errors(plan, get)
    try:
        metric, before = _reading(plan, get)
        _post(f"{proxy.url}/v1/completions", body, timeout)
        after = _grown_reading(plan, get, before)
    except (OSError, ValueError) as exc:  # URLError and HTTPError are OSErrors
        reason = _why(exc)
        return ProbeResult(
            mode=plan.mode, ok=False, at=now, detail=f"the probe request through {proxy.url} failed: {reason}"
        )
    moved = after - before
    p2p = plan.mode == "p2p"
    if moved <= 0:
        how = "Mooncake moved no KV to decode" if p2p else "decode found nothing prefill stored"
        detail = (
            f"{plan.mode}: {how} ({metric} did not grow for a {length}-token probe): "
            "decode recomputes every prompt"
        )
        grew = _grown(errors_before, _store_errors(plan, get))
        if grew:  # the storage, not the configuration, is why
            detail += f"; the UCM store failed meanwhile: {grew}"
        return ProbeResult(mode=plan.mode, ok=False, at=now, detail=detail)
    what = "KV-transfer tokens" if p2p else "external prefix hits"
    detail = f"{plan.mode}: decode's {what} grew by {moved:.0f} for a {length}-token probe"
    return ProbeResult(mode=plan.mode, ok=True, at=now, detail=detail)


def probe_pair(plan: Plan, prefill: Process, decode: Process, *, timeout: float = 300.0) -> ProbeResult:
    """Centralized mode, one instance added to a running deployment: a prompt prefilled on
    `prefill` (which stores its blocks), then sent to `decode` directly, as the proxy's two legs
    do; ok when `decode`'s external prefix hits grew. The new instance is not in routing yet."""
    get = lambda url: _get(url, timeout=10.0)  # noqa: E731
    body, length, now = _probe_body(plan), probe_tokens(plan), time.time()
    pair = f"{prefill.name} -> {decode.name}"
    try:
        metric, before = _reading(plan, get, [decode])
        leg = _post(f"{prefill.url}/v1/completions", {**body, "max_tokens": 1}, timeout)
        params = leg.get("kv_transfer_params") if isinstance(leg, dict) else None
        _post(
            f"{decode.url}/v1/completions",
            {**body, **({"kv_transfer_params": params} if params else {})},
            timeout,
        )
        after = _grown_reading(plan, get, before, [decode])
    except (OSError, ValueError) as exc:
        return ProbeResult(mode=plan.mode, ok=False, at=now, detail=f"the probe {pair} failed: {_why(exc)}")
    moved = after - before
    if moved <= 0:
        detail = (
            f"{pair}: {decode.name} found nothing {prefill.name} stored ({metric} did not grow "
            f"for a {length}-token probe): it would recompute every prompt"
        )
        return ProbeResult(mode=plan.mode, ok=False, at=now, detail=detail)
    detail = f"{pair}: external prefix hits grew by {moved:.0f} for a {length}-token probe"
    return ProbeResult(mode=plan.mode, ok=True, at=now, detail=detail)


def _probe_dynamic(plan: Plan, proxy: Process, timeout: float) -> ProbeResult:
    """Roles per request: the proxy may send both legs of the probe to one instance, which
    proves nothing of the store. The store's path is proved between the first prefill and the
    first decode instance directly (`probe_pair`), then one request through the proxy must be
    answered."""
    prefill = next(p for p in plan.processes if p.role == "prefill")
    decode = next(p for p in plan.processes if p.role == "decode")
    result = probe_pair(plan, prefill, decode, timeout=timeout)
    if not result.ok:
        return result
    try:
        _post(f"{proxy.url}/v1/completions", _probe_body(plan), timeout)
    except (OSError, ValueError) as exc:
        detail = f"the probe request through {proxy.url} failed: {_why(exc)}"
        return ProbeResult(mode=plan.mode, ok=False, at=result.at, detail=detail)
    detail = f"{plan.mode}, roles per request: {result.detail}; the proxy answered"
    return result.model_copy(update={"detail": detail})


def _probe_body(plan: Plan) -> dict:
    """A completion of a prompt of random token ids no cache holds."""
    rng = random.Random(time.time_ns())
    prompt = [rng.randrange(*TOKEN_RANGE) for _ in range(probe_tokens(plan))]
    return {"model": _served_name(plan), "prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0}


def _store_errors(plan: Plan, get: Callable[[str], str]) -> dict[str, dict[str, float]]:
    """Each store user's UCM error counters now (a server that does not answer: none)."""
    out = {}
    users = set(plan.store.users) if plan.store is not None else set()
    for p in plan.processes:
        if p.name in users and p.url:
            try:
                out[p.name] = errors_from_metrics(get(f"{p.url}/metrics"))
            except (OSError, ValueError):
                continue
    return out


def _grown(before: dict[str, dict[str, float]], after: dict[str, dict[str, float]]) -> str:
    """`prefill-0 save 8 (enotconn 8); decode-0 lookup 1 (enotconn 1)`: what grew, per process."""
    parts = []
    for name, now in after.items():
        was = before.get(name, {})
        said = describe({k: v - was.get(k, 0.0) for k, v in now.items()})
        if said:
            parts.append(f"{name} {said}")
    return "; ".join(parts)


def probe_tokens(plan: Plan) -> int:
    """PROBE_TOKENS, or what the smallest --max-model-len of the servers leaves for the answer."""
    limits = []
    for p in plan.processes:
        if p.is_server and "--max-model-len" in p.argv:
            i = p.argv.index("--max-model-len") + 1
            if i < len(p.argv) and p.argv[i].isdigit():
                limits.append(int(p.argv[i]) - MAX_TOKENS)
    return min([PROBE_TOKENS, *limits])


def _why(exc: BaseException) -> str:
    """One line: an HTTP error's own message (the proxy says which leg failed), else the error."""
    text = ""
    if isinstance(exc, urllib.error.HTTPError):
        try:
            body = json.loads(exc.read() or b"{}")
            text = f"HTTP {exc.code}: {body['error']['message']}"
        except (ValueError, KeyError, TypeError, OSError):
            text = f"HTTP {exc.code} {exc.reason}"
    text = text or str(getattr(exc, "reason", "") or exc) or type(exc).__name__
    return " ".join(text.split())[:300]


def _served_name(plan: Plan) -> str:
    for p in plan.processes:
        if p.is_server:
            argv = p.argv
            if "--served-model-name" in argv:
                return argv[argv.index("--served-model-name") + 1]
            serve = argv.index("serve")
            return argv[serve + 1]
    raise ValueError("no server in the plan")
