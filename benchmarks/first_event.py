"""What the first event of an answer that may move costs the proxy: the event that carries the
prompt's token ids (vLLM's `return_token_ids`), read as the proxy does now (`resume.Answer.feed`:
the ids cut out as written, read as numbers only if the answer moves) against reading them at once
(the reference, what it did before: the event parsed whole, every id made a number), in one run.

    python benchmarks/first_event.py [--rounds 9]

The event as vLLM writes it for a completion (the ids in its choice) and for a chat (after the
choices); prompts of 64, 4,096 and 32,768 tokens; the client did not ask for the ids, so both
ways take them out of its event. Rounds alternate the two ways; each figure is the median over
rounds of the median over 20 calls. This is on the path of every answer's first token.
"""

from __future__ import annotations

import argparse
import json
import statistics
from typing import Any

from benchmarks.block_keys import median_us
from ucmctl.proxy.resume import _IDS, Answer
from ucmctl.proxy.rewrite import CHAT, COMPLETIONS


def before(ev: bytes, path: str) -> tuple[bytes, list[int], list[int], str]:
    """The first event read as before: parsed whole for the answer's head, then each list of ids
    read as numbers, then taken out of the client's event (the same `Answer` made for it)."""
    Answer.of({"stream": True}, path)
    data = json.loads(ev[6:-2])
    head = data["id"]
    prompt: list[int] = []
    ids: list[int] = []
    for m in _IDS.finditer(ev):
        if m[2] != b"null":
            got = [int(t) for t in m[2][1:-1].split(b",") if t.strip()]
            if m[1] == b"token_ids":
                ids.extend(got)
            else:
                prompt = got
    return _IDS.sub(b"", ev[:-2]) + b"\n\n", prompt, ids, head


def now(ev: bytes, path: str) -> Answer:
    """The first event read as the proxy reads it now."""
    a = Answer.of({"stream": True}, path)
    a.feed(ev)
    return a


def event(tokens: int, chat: bool) -> bytes:
    """An answer's first event with its prompt's ids, as vLLM writes it."""
    ids = [(i * 7919) % 151_000 for i in range(tokens)]
    body: dict[str, Any] = {"id": "cmpl-1", "created": 1, "model": "m"}
    if chat:
        delta = {"role": "assistant", "content": "Hi"}
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": None, "token_ids": [42]}
        body |= {"object": "chat.completion.chunk", "choices": [choice], "usage": None}
        body["prompt_token_ids"] = ids
    else:
        choice = {"index": 0, "text": "Hi", "logprobs": None, "finish_reason": None, "stop_reason": None,
                  "prompt_token_ids": ids, "token_ids": [42]}  # fmt: skip
        body |= {"object": "text_completion", "choices": [choice], "usage": None}
    return b"data: " + json.dumps(body, separators=(",", ":")).encode() + b"\n\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=9)
    args = ap.parse_args()
    print(f"{args.rounds} rounds; medians of medians")
    print(f"{'first event':<28} {'bytes':>8} {'before':>10} {'now':>10} {'ratio':>7}")
    for chat in (False, True):
        path = CHAT if chat else COMPLETIONS
        for tokens in (64, 4096, 32768):
            ev = event(tokens, chat)
            a = Answer.of({"stream": True}, path)
            out = a.feed(ev)
            ref = before(ev, path)
            assert (out, a.prompt_ids, a.ids, a.head["id"]) == ref, "the two ways read it differently"
            assert len(ref[1]) == tokens and ref[2] == [42] and b"token_ids" not in out
            ways = {"before": lambda e=ev, p=path: before(e, p), "now": lambda e=ev, p=path: now(e, p)}
            took: dict[str, list[float]] = {name: [] for name in ways}
            for r in range(args.rounds):
                for name in ways if r % 2 == 0 else reversed(ways):
                    took[name].append(median_us(ways[name]))
            b, n = statistics.median(took["before"]), statistics.median(took["now"])
            name = f"{'chat' if chat else 'completion'}, {tokens:,} tokens"
            print(f"{name:<28} {len(ev):>8,} {b:>8.0f}us {n:>8.0f}us {n / b:>6.3f}x")


if __name__ == "__main__":
    main()
