"""The simulator's answers as vLLM's OpenAI-compatible server shapes them: whole, streamed (a
server-sent event per token), or n choices; the usage, and vLLM's error bodies."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from ucmctl.sim.engine import FINISHED, SimRequest
from ucmctl.sim.tokens import Tokenizer


class Decoder:
    """The tokenizer's text of tokens; of one token, decoded once and kept."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer
        self._pieces: dict[int, str] = {}

    def decode(self, tokens: list[int]) -> str:
        return self.tokenizer.decode(tokens)

    def piece(self, token: int) -> str:
        text = self._pieces.get(token)
        if text is None:
            text = self._pieces[token] = self.tokenizer.decode([token])
        return text


async def many(
    request: web.Request,
    rs: list[SimRequest],
    ctx: Reply,
    decoder: Decoder,
    stream: bool,
    include_usage: bool,
) -> web.StreamResponse:
    """n choices, as vLLM answers `n`: choice i from sequence i, tokens of the choices
    interleaved as they come when streamed; the prompt counted once in the usage."""
    if not stream:
        choices = []
        for i, r in enumerate(rs):
            tokens = [t async for t in tokens_of(r)]
            r.delivered = True
            choices.append(ctx.choice(i, decoder.decode(tokens), len(tokens) >= r.max_tokens))
        body = ctx.envelope(choices)
        body["usage"] = usage(rs[0], rs[1:])
        body["kv_transfer_params"] = ctx.kv_transfer_params
        return web.json_response(body)
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
    await response.prepare(request)
    if ctx.chat:  # each choice's first chunk names its role
        roles = [
            {
                "index": i,
                "delta": {"role": "assistant", "content": ""},
                "logprobs": None,
                "finish_reason": None,
            }
            for i in range(len(rs))
        ]
        await response.write(ctx.sse(roles))
    lock = asyncio.Lock()

    async def relay(i: int, r: SimRequest) -> None:
        sent = 0
        async for token in tokens_of(r):
            sent += 1
            async with lock:
                await response.write(ctx.sse([ctx.delta(i, decoder.piece(token), sent >= r.max_tokens)]))
        r.delivered = True

    await asyncio.gather(*(relay(i, r) for i, r in enumerate(rs)))
    if include_usage:
        await response.write(ctx.sse([], usage=usage(rs[0], rs[1:])))
    await response.write(b"data: [DONE]\n\n")
    await response.write_eof()
    return response


async def whole(r: SimRequest, ctx: Reply, decoder: Decoder) -> web.Response:
    """The answer of one choice, whole."""
    tokens: list[int] = []
    while (token := await r.out.get()) != FINISHED:
        tokens.append(token)
    r.delivered = True
    text = decoder.decode(tokens)
    finish = "length" if len(tokens) >= r.max_tokens else "abort"
    choice: dict[str, Any]
    if ctx.chat:
        choice = {
            "index": 0,
            "message": {"role": "assistant", "content": text},
            "logprobs": None,
            "finish_reason": finish,
            "stop_reason": None,
        }
    else:
        choice = {
            "index": 0,
            "text": text,
            "logprobs": None,
            "finish_reason": finish,
            "stop_reason": None,
        }
        if ctx.return_token_ids:
            choice.update({"prompt_token_ids": list(r.prompt), "token_ids": tokens})
    body = ctx.envelope([choice])
    if ctx.chat and ctx.return_token_ids:  # vLLM: the prompt's ids beside the choices
        choice["token_ids"] = tokens
        body["prompt_token_ids"] = list(r.prompt)
    body["usage"] = usage(r)
    body["kv_transfer_params"] = ctx.kv_transfer_params
    return web.json_response(body)


async def stream(
    request: web.Request, r: SimRequest, ctx: Reply, decoder: Decoder, include_usage: bool
) -> web.StreamResponse:
    """The answer of one choice, streamed: a chunk per token, what is ready sent in one write."""
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
    await response.prepare(request)
    if ctx.chat:
        first = {
            "index": 0,
            "delta": {"role": "assistant", "content": ""},
            "logprobs": None,
            "finish_reason": None,
        }
        # vLLM's return_token_ids: the prompt's ids on the first chunk ever (the role's)
        await response.write(ctx.sse([first], prompt_ids=list(r.prompt) if ctx.return_token_ids else None))
    # Every chunk is the same JSON but for its text: encode the frame once, fill in the text.
    head, middle, before_id, tail = ctx.token_frame()
    sent = 0
    done = False
    while not done:
        tokens = [await r.out.get()]
        while not r.out.empty():  # behind schedule: send what is ready in one write
            tokens.append(r.out.get_nowait())
        frames = []
        for token in tokens:
            if token == FINISHED:
                done = True
                break
            sent += 1
            if ctx.return_token_ids and sent == 1 and not ctx.chat:  # the prompt's ids ride along
                frames.append(ctx.token_ids_chunk(decoder.piece(token), token, sent >= r.max_tokens, r, True))
                continue
            text = json.dumps(decoder.piece(token)).encode()
            finish = b'"length"' if sent >= r.max_tokens else b"null"
            ids = b"%d" % token if ctx.return_token_ids else b""  # vLLM's return_token_ids: in every chunk
            frames.append(head + text + middle + finish + before_id + ids + tail)
        if frames:
            await response.write(b"".join(frames))
    if include_usage:
        await response.write(ctx.sse([], usage=usage(r)))
    r.delivered = True
    await response.write(b"data: [DONE]\n\n")
    await response.write_eof()
    return response


@dataclass
class Reply:
    """What every chunk and answer of one request repeats, and how each is shaped."""

    id: str
    model: str
    chat: bool
    created: int
    kv_transfer_params: dict[str, Any] | None
    return_token_ids: bool = False

    def token_ids_chunk(self, text: str, token: int, last: bool, r: Any, first: bool) -> bytes:
        """A completion's first chunk as vLLM sends it with return_token_ids: the prompt's ids
        with the first token's (a chat's came with its role chunk)."""
        choice = {
            "index": 0,
            "text": text,
            "logprobs": None,
            "finish_reason": "length" if last else None,
            "stop_reason": None,
            "prompt_token_ids": list(r.prompt) if first else None,
            "token_ids": [token],
        }
        return self.sse([choice])

    def choice(self, i: int, text: str, length: bool) -> dict[str, Any]:
        """Choice `i` of a whole answer."""
        finish = "length" if length else "abort"
        if self.chat:
            return {
                "index": i,
                "message": {"role": "assistant", "content": text},
                "logprobs": None,
                "finish_reason": finish,
                "stop_reason": None,
            }
        return {"index": i, "text": text, "logprobs": None, "finish_reason": finish, "stop_reason": None}

    def delta(self, i: int, text: str, last: bool) -> dict[str, Any]:
        """Choice `i` of a streamed chunk: one token."""
        finish = "length" if last else None
        if self.chat:
            return {"index": i, "delta": {"content": text}, "logprobs": None, "finish_reason": finish}
        return {"index": i, "text": text, "logprobs": None, "finish_reason": finish, "stop_reason": None}

    def envelope(self, choices: list[dict[str, Any]]) -> dict[str, Any]:
        kind = "chat.completion" if self.chat else "text_completion"
        return {
            "id": self.id,
            "object": kind,
            "created": self.created,
            "model": self.model,
            "choices": choices,
        }

    def token_frame(self) -> tuple[bytes, bytes, bytes, bytes]:
        """The bytes of a one-token chunk around its JSON text, its finish reason and, with
        return_token_ids, its token's id (else the last part is empty)."""
        marker_text, marker_finish = "\x00TEXT\x00", "\x00FINISH\x00"
        if self.chat:
            choice: dict[str, Any] = {
                "index": 0,
                "delta": {"content": marker_text},
                "logprobs": None,
                "finish_reason": marker_finish,
            }
        else:
            choice = {
                "index": 0,
                "text": marker_text,
                "logprobs": None,
                "finish_reason": marker_finish,
                "stop_reason": None,
            }
        if self.return_token_ids:
            if not self.chat:
                choice["prompt_token_ids"] = None
            choice["token_ids"] = []
        frame = self.sse([choice]).decode()
        head, rest = frame.split(json.dumps(marker_text), 1)
        middle, tail = rest.split(json.dumps(marker_finish), 1)
        if self.return_token_ids:  # the token's id goes in between: `before_id` ID `tail`
            ids_at = tail.index('"token_ids":[') + len('"token_ids":[')
            return head.encode(), middle.encode(), tail[:ids_at].encode(), tail[ids_at:].encode()
        return head.encode(), middle.encode(), tail.encode(), b""

    def sse(
        self,
        choices: list[dict[str, Any]],
        usage: dict[str, int] | None = None,
        prompt_ids: list[int] | None = None,
    ) -> bytes:
        body = self.envelope(choices)
        if self.chat:
            body["object"] = "chat.completion.chunk"
        body["usage"] = usage
        if prompt_ids is not None:
            body["prompt_token_ids"] = prompt_ids
        return b"data: " + json.dumps(body, separators=(",", ":")).encode() + b"\n\n"


async def tokens_of(r: SimRequest) -> AsyncIterator[int]:
    while (token := await r.out.get()) != FINISHED:
        yield token


def usage(r: SimRequest, others: list[SimRequest] | None = None) -> dict[str, Any]:
    """The request's usage; with n > 1 the prompt counts once, every choice's tokens."""
    cached = r.local_hit_tokens + r.external_hit_tokens
    generated = r.generated + sum(o.generated for o in others or [])
    return {
        "prompt_tokens": len(r.prompt),
        "total_tokens": len(r.prompt) + generated,
        "completion_tokens": generated,
        "prompt_tokens_details": {"cached_tokens": cached} if cached else None,
    }


def internal_error_reply() -> web.Response:
    # what vLLM answers for a request it failed during generation (a KV load failure)
    error = {"message": "Internal server error", "type": "InternalServerError", "param": None, "code": 500}
    return web.json_response({"error": error}, status=500)


def error_reply(message: str, param: str | None, status: int = 400) -> web.Response:
    # vLLM's error shape: {"error": {"message", "type", "param", "code"}}
    kind = "NotFoundError" if status == 404 else "BadRequestError"
    error = {"message": message, "type": kind, "param": param, "code": status}
    return web.json_response({"error": error}, status=status)
