"""What the proxy's JSON work costs for one long prompt: parsing the client's body and writing each
leg's payload, with the long values' text reused (ucmctl.proxy.jsontext, what the proxy runs)
against writing every payload with json.dumps (the reference, what it did before), in one run.

    python benchmarks/long_prompt_payloads.py [--tokens 32768] [--rounds 9]

The request of a `pd` deployment on the store that can move its answer (the default): the body
parsed, the legs' request with `return_token_ids`, the prefill leg's payload; and, P2P (Mooncake),
the decode leg's payload with the prefiller's `kv_transfer_params` too. Prompts of token ids and
of text (4 characters a token), and a chat of the same length. Rounds alternate the two ways;
each figure is the median over rounds of the median over 20 calls.
"""

from __future__ import annotations

import argparse
import json
import statistics
from typing import Any

from benchmarks.block_keys import median_us
from ucmctl.proxy import resume, rewrite
from ucmctl.proxy.rewrite import CHAT, COMPLETIONS

PARAMS = {"do_remote_prefill": True, "transfer_id": "x"}


def before(raw: bytes, path: str, p2p: bool) -> list[bytes]:
    """The request's JSON work as the proxy did it: the same calls with no text kept (each
    payload written whole by json.dumps)."""
    body = json.loads(raw)
    leg_raw, leg = resume.with_token_ids(body)
    out = [leg_raw, rewrite.prefill_payload(leg, p2p=None)]
    return [*out, rewrite.decode_payload(leg_raw, leg, PARAMS)] if p2p else out


def now(raw: bytes, path: str, p2p: bool) -> list[bytes]:
    """The same work as the proxy does it now."""
    body, texts = rewrite.parse_body(raw, path)
    leg_raw, leg = resume.with_token_ids(body, texts)
    out = [leg_raw, rewrite.prefill_payload(leg, texts, p2p=None)]
    return [*out, rewrite.decode_payload(leg_raw, leg, PARAMS, texts)] if p2p else out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=32768)
    ap.add_argument("--rounds", type=int, default=9)
    args = ap.parse_args()
    text = "".join(chr(97 + i % 26) + (" " if i % 5 == 4 else "") for i in range(args.tokens * 4))
    bodies: dict[str, tuple[dict[str, Any], str]] = {
        "token ids": ({"prompt": [(i * 7919) % 151_000 for i in range(args.tokens)]}, COMPLETIONS),
        "text": ({"prompt": text}, COMPLETIONS),
    }
    half = len(text) // 2
    messages = [{"role": "system", "content": text[:half]}, {"role": "user", "content": text[half:]}]
    bodies["chat"] = ({"messages": messages}, CHAT)
    print(f"{args.tokens}-token prompts; {args.rounds} rounds; medians of medians")
    for prompt, path in bodies.values():  # both ways write the same legs (the key order aside)
        raw = json.dumps({"model": "m", **prompt, "max_tokens": 64, "stream": True}).encode()
        for p2p in (False, True):
            old, new = before(raw, path, p2p), now(raw, path, p2p)
            assert [json.loads(b) for b in old] == [json.loads(b) for b in new], "different payloads"
    for name, (prompt, path) in bodies.items():
        raw = json.dumps({"model": "m", **prompt, "max_tokens": 64, "stream": True}).encode()
        for p2p in (False, True):
            a, b = [], []
            for _ in range(args.rounds):
                a.append(median_us(lambda r=raw, p=p2p, path=path: before(r, path, p)))
                b.append(median_us(lambda r=raw, p=p2p, path=path: now(r, path, p)))
            old, new = statistics.median(a), statistics.median(b)
            legs = "store (2 payloads)" if not p2p else "P2P (3 payloads)"
            print(f"{name:9} {legs:18}: before {old / 1000:6.2f} ms, now {new / 1000:6.2f} ms: "
                  f"{new / old:.2f}x ({len(raw) / 1024:.0f} KiB body)")  # fmt: skip


if __name__ == "__main__":
    main()
