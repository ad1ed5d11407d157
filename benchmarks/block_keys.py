"""What naming a prompt's blocks costs the proxy (`kv` routing, `direct_below`): `block_keys` of
one request against the chain it replaced (a BLAKE2b digest a block, chained), in the same run.

    python benchmarks/block_keys.py [--tokens 32768] [--block-size 16] [--rounds 9]

Prompts of token ids (what `bench` and most clients send) and of text (4 characters a token).
Rounds alternate the two ways so that other work on the machine hits both alike; each figure is
the median over rounds of the median over 20 calls. Also prints what the proxy pays before any
of it for the same request: parsing its JSON body. Target (#47): a routing decision in 200 us
for a 32k-token prompt.
"""

from __future__ import annotations

import argparse
import array
import hashlib
import json
import statistics
import time
from collections.abc import Callable
from typing import Any

from ucmctl.proxy.kv_index import block_keys
from ucmctl.proxy.rewrite import CHARS_PER_TOKEN, COMPLETIONS, prompt_of


def digest_chain(body: dict[str, Any], path: str, block_size: int) -> tuple[bytes, ...]:
    """The keys as ucmctl named blocks before (a 16-byte BLAKE2b a block, chained): the reference."""
    prompt = prompt_of(body, path)
    if isinstance(prompt, str):
        raw, step = prompt.encode(), block_size * CHARS_PER_TOKEN
    else:
        raw, step = array.array("q", prompt).tobytes(), block_size * 8
    view = memoryview(raw)
    key = hashlib.blake2b(str(body.get("model", "")).encode(), digest_size=16).digest()
    keys = []
    for start in range(0, len(raw) - step + 1, step):
        h = hashlib.blake2b(key, digest_size=16)
        h.update(view[start : start + step])
        key = h.digest()
        keys.append(key)
    return tuple(keys)


def median_us(call: Callable[[], object], calls: int = 20) -> float:
    times = []
    for _ in range(calls):
        t0 = time.perf_counter()
        call()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=32768)
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=9)
    args = ap.parse_args()
    ids = {"model": "m", "prompt": [(i * 7919) % 151_000 for i in range(args.tokens)]}
    text = {"model": "m", "prompt": "".join(chr(97 + i % 26) for i in range(args.tokens * CHARS_PER_TOKEN))}
    raw = json.dumps(ids).encode()
    for name, body in (("token ids", ids), ("text", text)):
        new, old = [], []
        for _ in range(args.rounds):
            new.append(median_us(lambda b=body: block_keys(b, COMPLETIONS, args.block_size)))
            old.append(median_us(lambda b=body: digest_chain(b, COMPLETIONS, args.block_size)))
        n, o = statistics.median(new), statistics.median(old)
        blocks = len(block_keys(body, COMPLETIONS, args.block_size))
        verdict = "met" if n <= 200 else "not met"
        print(f"{name}: {args.tokens} tokens, {blocks} blocks of {args.block_size}: block_keys {n:.0f} us, "
              f"digest chain {o:.0f} us: {n / o:.2f}x (target 200 us: {verdict})")  # fmt: skip
    parse = statistics.median(median_us(lambda: json.loads(raw)) for _ in range(args.rounds))
    conv = statistics.median(median_us(lambda: array.array("q", ids["prompt"])) for _ in range(args.rounds))
    print(f"the same request's JSON body parsed: {parse:.0f} us; its ids made 8-byte integers: {conv:.0f} us")


if __name__ == "__main__":
    main()
