"""A text or chat prompt's exact token ids, from an instance's own `/tokenize` (vLLM's: the served
model's tokenizer and chat template, with the request's own template settings), so that its
blocks are named as the engine names them: the keys then meet the ones its KV-cache events
carry, and the prompt's length is counted, not estimated.

One more round trip to an API server per text request, only where routing reads the KV index.
Where `/tokenize` cannot answer (an engine without it, a request it refuses, a timeout), the
request is routed on the estimate (the text's bytes: it still meets the proxy's routing history,
not the events), counted by outcome; an engine that has no `/tokenize` (404) is not asked again.
"""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

import aiohttp

from ucmctl.proxy import rewrite
from ucmctl.proxy.pool import Instance, Pool
from ucmctl.proxy.upstream import UPSTREAM_ERRORS

# what shapes the engine's token ids of a chat beside its messages (vLLM's TokenizeChatRequest)
CHAT_FIELDS = (
    "add_generation_prompt",
    "continue_final_message",
    "add_special_tokens",
    "chat_template",
    "chat_template_kwargs",
    "tools",
    "mm_processor_kwargs",
    "media_io_kwargs",
)
TIMEOUT_S = 10.0
OUTCOMES = ("exact", "refused", "failed", "no_endpoint")


def tokenize_body(body: dict[str, Any], path: str) -> dict[str, Any] | None:
    """The `/tokenize` request for a text or chat prompt; None for token ids (already exact)."""
    model = body.get("model")
    if path == rewrite.CHAT:
        ask = {"messages": body["messages"], **{k: body[k] for k in CHAT_FIELDS if k in body}}
    else:
        prompt = body["prompt"]
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
            prompt = prompt[0]
        if not isinstance(prompt, str):  # token ids, or several prompts (one request each)
            return None
        ask = {"prompt": prompt}
        if "add_special_tokens" in body:
            ask["add_special_tokens"] = body["add_special_tokens"]
    return {"model": model, **ask} if model is not None else ask


class Tokenizer:
    """Asks the instances' `/tokenize` in turn; counts what each ask came to."""

    def __init__(self, pool: Pool) -> None:
        self.pool = pool
        self.outcomes: Counter[str] = Counter({k: 0 for k in OUTCOMES})
        self.unavailable = False  # an engine answered 404: it has no /tokenize
        self._turn = 0

    def _instance(self) -> Instance | None:
        cands = [i for i in self.pool.all() if i.routable]
        if not cands:
            return None
        self._turn += 1
        return cands[self._turn % len(cands)]

    async def ids(
        self, session: aiohttp.ClientSession, body: dict[str, Any], path: str, headers: dict[str, str]
    ) -> list[int] | None:
        """The prompt's token ids; None where the prompt is token ids already or no instance
        tokenized it (the caller estimates)."""
        ask = tokenize_body(body, path)
        if ask is None or self.unavailable:
            return None
        inst = self._instance()
        if inst is None:
            return None
        timeout = aiohttp.ClientTimeout(total=TIMEOUT_S)
        try:
            async with session.post(
                inst.endpoint("/tokenize"), data=json.dumps(ask), headers=headers, timeout=timeout
            ) as resp:
                text = await resp.text()
                if resp.status != 200:
                    # no route (a server's own 404/405, not an OpenAI error), or the prompt refused
                    # (its own leg may be refused the same way, and says so to the client)
                    routeless = resp.status in (404, 405) and '"error"' not in text
                    return self._count("no_endpoint" if routeless else "refused")
                got = json.loads(text)
        except (*UPSTREAM_ERRORS, ValueError):
            return self._count("failed")
        tokens = got.get("tokens") if isinstance(got, dict) else None
        if not isinstance(tokens, list) or not all(type(t) is int for t in tokens):
            return self._count("failed")
        self.outcomes["exact"] += 1
        return tokens

    def _count(self, outcome: str) -> list[int] | None:
        """Count an ask that gave no ids (the caller then estimates)."""
        self.outcomes[outcome] += 1
        if outcome == "no_endpoint":
            self.unavailable = True
        return None

    def describe(self) -> dict[str, object]:
        """For /routing: where text prompts' token ids come from, and how each ask ended."""
        source = "estimated (the instances have no /tokenize)" if self.unavailable else "exact (/tokenize)"
        return {"source": source, **self.outcomes}
