"""What a `kv` routing decision costs the proxy for one long prompt: naming its blocks and the
policy's walk over the index for every candidate, in C (csrc/kv_index.cpp, what the proxy runs)
against the Python code it stands in for (the reference, measured in the same run).

    python benchmarks/routing_decision.py [--tokens 32768] [--block-size 16] [--rounds 9]

A prompt of token ids; four mixed candidates; an index holding 64 other prompts of the same
length (a realistic table, not a cache-resident one) and three quarters of this prompt (held by
one instance, in the store). Each decision is timed as the proxy makes it: right after the
request's body was parsed (its ids fresh in the cache, as they are there; the parse not timed).
Each round times 50 decisions one by one, C then Python, after 5 not counted (the other
implementation's round before it left the caches and the heap as the proxy never has them); the
figures are over every counted decision of every round (p50, p90, p99). Then the C rounds again
back to back ("alone"), as the proxy runs them: no Python round between. Also: the index's update after a leg
(the proxy makes it twice a request: sent, answered) and, what every policy pays before any of
it, parsing the request's JSON body. Target (#47): a routing decision for a 32k-token prompt
within 200 us p99.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from ucmctl.proxy import jsontext, kv_index, rewrite
from ucmctl.proxy.kv_index import KvIndex, NativeKvIndex, block_keys
from ucmctl.proxy.pool import Instance
from ucmctl.proxy.rewrite import COMPLETIONS
from ucmctl.proxy.routing.base import Ask
from ucmctl.proxy.routing.kv import Kv

CALLS = 50
WARM_UP = 5  # decisions of each round not counted


@contextmanager
def python_keys(on: bool) -> Iterator[None]:
    """Block keys by the numpy code (as where the native module is not built), while `on`."""
    native = kv_index._native
    if on:
        kv_index._native = None
    try:
        yield
    finally:
        kv_index._native = native


def times_us(call: Callable[[], object], calls: int = CALLS) -> list[float]:
    out = []
    for _ in range(calls):
        t0 = time.perf_counter()
        call()
        out.append((time.perf_counter() - t0) * 1e6)
    return out


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


class Setup:
    """One implementation's index, policy and candidates, warmed as the docstring says."""

    def __init__(self, index: KvIndex, body: dict[str, object], block_size: int, others: int) -> None:
        self.insts = [Instance(f"http://h{i}:1", "mixed") for i in range(4)]
        self.policy = Kv(block_size, index)
        self.body, self.block_size = body, block_size
        prompt = list(body["prompt"])  # type: ignore[call-overload]
        for n in range(others):
            other = {"model": "m", "prompt": [n + 1, *prompt[1:]]}  # shares no block with the prompt
            index.took(block_keys(other, COMPLETIONS, block_size), self.insts[n % 4], saved=True)
        self.keys = block_keys(body, COMPLETIONS, block_size)
        index.took(self.keys[: len(self.keys) * 3 // 4], self.insts[1], saved=True)
        self.tokens = len(prompt)

    def decide(self, body: dict[str, object] | None = None, texts: jsontext.Texts | None = None) -> Instance:
        """What the proxy does for the request: its blocks' keys (read off the ids the parse
        packed, where `texts` has them), then the policy's choice."""
        keys = block_keys(body or self.body, COMPLETIONS, self.block_size, texts)
        return self.policy.choose(self.insts, Ask("mixed", "requests", self.tokens, blocks=keys))

    def decisions_us(self, raw: bytes, calls: int = CALLS, packed: bool = True) -> list[float]:
        """Decisions timed one by one, each right after its request's body was parsed; without
        `packed`, the keys read from the prompt's int objects (as before the parse packed them)."""
        out = []
        for _ in range(WARM_UP + calls):
            body, texts = rewrite.parse_body(raw, COMPLETIONS)  # as the proxy parses it
            t0 = time.perf_counter()
            self.decide(body, texts if packed else None)
            out.append((time.perf_counter() - t0) * 1e6)
        return out[WARM_UP:]

    def update(self) -> None:
        self.policy.index.took(self.keys, self.insts[2], saved=False)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=32768)
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--others", type=int, default=64, help="other prompts in the index")
    args = ap.parse_args()
    if kv_index._native is None:
        raise SystemExit("the native module is not built: pip install -e . first")
    body = {"model": "m", "prompt": [(i * 7919) % 151_000 for i in range(args.tokens)]}
    c = Setup(NativeKvIndex(), body, args.block_size, args.others)
    with python_keys(True):
        py = Setup(KvIndex(), body, args.block_size, args.others)
    chosen = {c.decide().url, py.decide().url}
    assert chosen == {c.insts[1].url}, chosen  # both choose the instance that holds 3/4 of it
    raw = json.dumps(body).encode()
    rows: dict[str, dict[str, list[float]]] = {"decision": {}, "update": {}, "parse": {}}
    for _ in range(args.rounds):
        for name, s in (("c", c), ("python", py)):
            with python_keys(name == "python"):
                rows["decision"].setdefault(name, []).extend(s.decisions_us(raw))
                rows["update"].setdefault(name, []).extend(times_us(s.update, 10))
        rows["parse"].setdefault("c", []).extend(times_us(lambda: rewrite.parse_body(raw, COMPLETIONS), 10))
    alone = [t for _ in range(args.rounds) for t in c.decisions_us(raw)]  # no Python's round between
    objects = [t for _ in range(args.rounds) for t in c.decisions_us(raw, packed=False)]
    blocks = len(c.keys)
    print(f"{args.tokens} token ids, {blocks} blocks of {args.block_size}, 4 candidates, "
          f"index of {len(c.policy.index)} blocks; {args.rounds} rounds")  # fmt: skip
    labels = {"decision": "routing decision (keys + choice)", "update": "index update after a leg"}
    for what, label in labels.items():
        cs, ps = rows[what]["c"], rows[what]["python"]
        c50, p50 = statistics.median(cs), statistics.median(ps)
        print(f"{label}: C p50 {c50:.0f}, p90 {pct(cs, 0.9):.0f}, p99 {pct(cs, 0.99):.0f} us; "
              f"Python p50 {p50:.0f}, p99 {pct(ps, 0.99):.0f} us; C/Python p50 {c50 / p50:.3f}x")  # fmt: skip
    print(f"routing decision, C alone (its rounds back to back): p50 {statistics.median(alone):.0f}, "
          f"p90 {pct(alone, 0.9):.0f}, p99 {pct(alone, 0.99):.0f} us")  # fmt: skip
    print(f"routing decision, C, keys read from the prompt's int objects (before the parse packed "
          f"them): p50 {statistics.median(objects):.0f}, p90 {pct(objects, 0.9):.0f}, "
          f"p99 {pct(objects, 0.99):.0f} us")  # fmt: skip
    p99, p99_alone = pct(rows["decision"]["c"], 0.99), pct(alone, 0.99)
    verdict = "met" if max(p99, p99_alone) <= 200 else "met alone" if p99_alone <= 200 else "not met"
    print(f"target (decision p99 <= 200 us): {verdict} (beside Python's rounds {p99:.0f} us, "
          f"alone {p99_alone:.0f} us)")  # fmt: skip
    entries = args.others * blocks // 2
    bound = NativeKvIndex(entries)  # given twice as many blocks as it keeps
    for n in range(args.others):
        other = {"model": "m", "prompt": [n + 1, *body["prompt"][1:]]}  # type: ignore[index]
        bound.took(block_keys(other, COMPLETIONS, args.block_size), c.insts[0], saved=True)
    mib = bound._index.nbytes / 2**20
    print(f"the index in C bounded to {entries} blocks, given {2 * entries}: holds {len(bound)}, "
          f"{mib:.1f} MiB")  # fmt: skip
    parse = statistics.median(rows["parse"]["c"])
    print(f"the request's JSON body parsed and checked (every policy, before routing): p50 {parse:.0f} us")


if __name__ == "__main__":
    main()
