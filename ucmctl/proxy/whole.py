"""A whole answer (`stream` not asked for) that can go on on another instance when its instance
dies: the proxy asks the engine for a stream (with usage and token ids), so it knows the tokens
generated so far when the stream breaks, and the client gets one body at the end, assembled from
the events as its stream would have carried them (after `resume.Answer` made one answer of its
legs).

The body has vLLM's shape (0.32: the OpenAI fields and vLLM's own, as `vllm serve` answers a
request that did not stream; the real-vLLM test compares the two field by field). A whole answer
that cannot go on faithfully (`resume.refusal`) is not streamed: it goes to the engine as it came
and, as before, is sent again whole when its instance dies before answering.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from ucmctl.proxy.resume import Answer
from ucmctl.proxy.state import error_response


def streamed(body: dict[str, Any]) -> dict[str, Any]:
    """The legs' request for a whole answer: a stream with the usage at its end."""
    return {**body, "stream": True, "stream_options": {"include_usage": True}}


class Body:
    """Where the request path writes the client's events while it relays an answer (in place of
    the client's stream), assembled into one body at the end; or why the answer failed."""

    def __init__(self, answer: Answer) -> None:
        self.answer = answer
        self.headers: dict[str, str] = {}  # the request path looks at a stream's headers
        self.failed: str | None = None
        self._events: list[bytes] = []

    async def prepare(self, request: web.Request) -> None:
        """Nothing goes to the client before the end."""

    async def write(self, data: bytes) -> None:
        self._events.append(data)

    async def write_eof(self) -> None:
        """The answer is whole: the request path sends `response()`."""

    def fail(self, message: str) -> None:
        """The answer broke and does not go on: the client gets this error, no part of it."""
        self.failed = message

    def body(self) -> dict[str, Any]:
        """The answer as `vllm serve` sends a whole one."""
        return assemble(b"".join(self._events), self.answer)

    def response(self, rid: str) -> web.Response:
        """What the client gets: the answer, or the error that says why it broke."""
        if self.failed is not None:
            return error_response(502, self.failed, rid)
        return web.json_response(self.body(), headers={"X-Request-Id": rid})


@dataclass
class _Read:
    """What the events of one answer carried."""

    head: dict[str, Any] = field(default_factory=dict)  # id, created, model
    text: list[str] = field(default_factory=list)
    role: str = "assistant"
    logprobs: dict[str, list[Any]] | None = None  # a completion's, every list of them run on
    finish: Any = None
    stop: Any = None
    usage: dict[str, Any] | None = None
    fingerprint: str | None = None

    def choice(self, c: dict[str, Any], chat: bool) -> None:
        if chat:
            delta = c.get("delta") or {}
            self.role = delta.get("role") or self.role
            self.text.append(delta.get("content") or "")
        else:
            self.text.append(c.get("text") or "")
            self.logprobs = _more_logprobs(self.logprobs, c.get("logprobs"))
        if c.get("finish_reason") is not None:
            self.finish, self.stop = c["finish_reason"], c.get("stop_reason")


def assemble(stream: bytes, answer: Answer) -> dict[str, Any]:
    """One body of the events of a streamed answer (one choice) as its client got them."""
    read = _Read()
    for ev in stream.split(b"\n\n"):
        if ev.startswith(b"data: {"):
            data = json.loads(ev[6:])
            read.head = read.head or {k: data.get(k) for k in ("id", "created", "model")}
            read.usage = data.get("usage") or read.usage
            read.fingerprint = data.get("system_fingerprint") or read.fingerprint
            for c in data.get("choices") or ():
                read.choice(c, answer.chat)
    ids = list(answer.ids) if answer.keep_ids else None
    prompt_ids = answer.prompt_ids if answer.keep_ids else None
    ends = {"finish_reason": read.finish, "stop_reason": read.stop, "token_ids": ids}
    text = "".join(read.text)
    if answer.chat:
        message = {"role": read.role, "content": text, "refusal": None, "annotations": None, "audio": None}
        message |= {"function_call": None, "reasoning": None}
        choice = {"index": 0, "message": message, "logprobs": None, **ends, "routed_experts": None}
        tail = {"prompt_logprobs": None, "prompt_token_ids": prompt_ids, "prompt_text": None}
    else:
        choice = {"index": 0, "text": text, "logprobs": read.logprobs, **ends, "prompt_logprobs": None}
        choice |= {"prompt_token_ids": prompt_ids, "routed_experts": None}
        tail = {}
    details = {"prompt_tokens_details": None, "completion_tokens_details": None}  # where the stream had none
    usage = details | (read.usage or answer.usage())
    obj = "chat.completion" if answer.chat else "text_completion"
    head = read.head
    body = {"id": head.get("id"), "object": obj, "created": head.get("created"), "model": head.get("model")}
    body |= {"choices": [choice], "service_tier": None}
    body |= {"system_fingerprint": read.fingerprint, "usage": usage, **tail}
    return body | {"kv_transfer_params": None, "ec_transfer_params": None, "metrics": None}


def _more_logprobs(so_far: dict[str, list[Any]] | None, more: Any) -> dict[str, list[Any]] | None:
    """A completion's logprobs with a chunk's appended (each of their lists goes on)."""
    if not isinstance(more, dict):
        return so_far
    if so_far is None:
        return {k: list(v) for k, v in more.items() if isinstance(v, list)}
    for k, v in more.items():
        if isinstance(v, list):
            so_far.setdefault(k, []).extend(v)
    return so_far
