"""Mid-stream migration: a streamed answer whose instance failed after its first token goes on on
another instance, and the client sees one answer.

The legs that generate ask the engine for token ids (vLLM's `return_token_ids`); `Answer` reads
them off the stream as it passes (and takes them out where the client did not ask for them), so
that when the stream breaks, the proxy knows the prompt's ids and the answer's so far. The
continuation is a completion of those ids together, with what is left of `max_tokens` and the
same sampling parameters: its instance loads their KV from the store (the prompt's blocks, and
the answer's that the failed instance saved as it generated) instead of computing them. Its
events are rewritten into the client's answer: the same `id`, `created` and `model`, chat deltas
for a chat request, `usage` for the whole answer.

Pure functions and one class, no I/O; the request path (ucmctl.proxy.flow) does the sending.
"""

from __future__ import annotations

import json
import re
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from ucmctl.proxy import jsontext
from ucmctl.proxy.jsontext import Texts
from ucmctl.proxy.rewrite import CHAT, COMPLETIONS

try:  # the common read in C (csrc/sse_ids.cpp): a token's work costs the proxy ~0.3 us, not ~2 us
    from ucmctl.proxy._sse import RECENT
    from ucmctl.proxy._sse import Feed as _NativeFeed
except ImportError:  # a source tree not built: the same reads in Python
    _NativeFeed = None
    RECENT = 4  # the last reads kept (the finish and the usage are read off them)

# a chunk's token ids, as vLLM writes them (never the first field of an object)
_IDS = re.compile(rb',"(prompt_token_ids|token_ids)":(null|\[[0-9, ]*\])')
_TOKEN_IDS = re.compile(rb',"token_ids":\[([0-9, ]*)\]')
_IDS_AT = b',"token_ids":['  # where an event's token ids begin (vLLM writes them as a list)
_NO_PROMPT_IDS = b',"prompt_token_ids":null'  # in each completion event after the first, before them
_ERROR = (b'data: {"error"', b'"object":"error"')
_FINISHED = b'"finish_reason":"'
# a chunk whose token brought no text: the middle of a character split over several tokens (the
# engine holds its bytes back until it is whole)
_NO_TEXT = (b'"text":""', b'"delta":{}', b'"content":""')
_DONE = b"data: [DONE]"
_PROMPT_IDS_KEY = b'"prompt_token_ids":'
_PROMPT_IDS_AT = b',"prompt_token_ids":['  # where the first event's prompt ids begin

# Guided decoding cannot be resumed from a token in the middle of its grammar (Dynamo turned its
# migration off for it after corrupted outputs).
_GUIDED = ("response_format", "guided_json", "guided_regex", "guided_choice", "guided_grammar",
           "structured_outputs")  # fmt: skip
# the request fields a continuation does not carry over from a completion request
_NOT_CARRIED = ("prompt", "echo", "suffix", "max_tokens", "min_tokens", "n", "best_of", "stream",
                "kv_transfer_params", "return_token_ids", "truncate_prompt_tokens")  # fmt: skip
# the sampling fields of a chat request that a completion request takes as they are
_CHAT_SAMPLING = ("model", "temperature", "top_p", "top_k", "min_p", "seed", "stop_token_ids",
                  "ignore_eos", "repetition_penalty", "skip_special_tokens", "spaces_between_special_tokens",
                  "include_stop_str_in_output", "logit_bias", "allowed_token_ids", "bad_words", "cache_salt",
                  "priority", "user", "stream_options")  # fmt: skip


def refusal(body: dict[str, Any], path: str) -> str | None:
    """Why a streamed answer to `body` cannot be continued faithfully on another instance, or None."""
    if body.get("n") not in (None, 1) or body.get("best_of") not in (None, 1):
        return "n > 1 (several answers)"
    if any(body.get(name) for name in _GUIDED):
        return "guided decoding (response_format)"
    if path == CHAT and body.get("tools") and body.get("tool_choice") != "none":
        return "tool calls"
    if body.get("echo") or body.get("prompt_logprobs"):
        return "echo or prompt_logprobs"
    if body.get("presence_penalty") or body.get("frequency_penalty"):
        # they weigh the answer's own tokens, which a continuation reads as prompt
        return "presence or frequency penalty"
    if body.get("stop"):
        # the engine holds text back while it may be the start of a stop string: that text is
        # lost when the stream breaks (the continuation starts after its tokens)
        return "stop strings"
    if path == CHAT and body.get("logprobs"):
        return "logprobs of a chat answer"
    prompt = body.get("prompt")
    if path == COMPLETIONS and isinstance(prompt, list) and prompt and not isinstance(prompt[0], int):
        return "several prompts"
    if body.get("stream_options") and not body.get("stream"):
        # the engine refuses it (vLLM: only with stream=True): the proxy must not stream it
        return "stream_options without stream"
    return None


def with_token_ids(body: dict[str, Any], texts: Texts | None = None) -> tuple[bytes, dict[str, Any]]:
    """The client's request asking the engine for token ids: the legs' payload and body."""
    leg = {**body, "return_token_ids": True}
    return jsontext.dumps(leg, texts or {}), leg


@dataclass
class Answer:
    """A streamed answer as the client has it: its envelope, the token ids so far, and its end."""

    chat: bool
    keep_ids: bool  # the client asked for the token ids itself
    usage_asked: bool  # stream_options.include_usage
    limit: int | None  # max_tokens (chat: max_completion_tokens), None: the engine's own
    whole: bool = False  # not streamed: the legs stream, the client gets one body (ucmctl.proxy.whole)
    logprobs: bool = False  # a completion's logprobs: their text offsets go on across the seam
    offset: int = 0  # the text offset of the next token (vLLM's: the last one's plus its length)
    base: int = 0  # the text offset where the leg now streaming began (its own offsets start at 0)
    silent: int = 0  # the last tokens, whose text has not come yet (a character's first bytes)
    skip: int = 0  # of a continuation's first tokens, those the client had (the silent ones)
    head: dict[str, Any] = field(default_factory=dict)  # id, created, model of the first chunk
    # the prompt's ids as the engine wrote them (digits and commas), read as numbers only where a
    # continuation or a whole answer needs them: a long prompt's first event costs a cut, not a parse
    _prompt_raw: bytes | None = None
    _prompt_ids: list[int] | None = None
    _ids: list[int] = field(default_factory=list)  # the answer's token ids read so far
    _unread: list[bytes] = field(default_factory=list)  # and those still as the stream wrote them
    _recent: deque[bytes] = field(default_factory=lambda: deque(maxlen=RECENT))  # the last events' bytes
    # the common read (whole events with ids, the head known, no logprobs) done in C, which then
    # keeps the last reads and the ids it read (None: Python does it all)
    _native: Any = None
    _fast: Any = None  # its `feed` once the common read may come
    _resumed: bool = False  # a continuation streams now (its events are read whole)
    finished: bool = False  # a finish_reason came
    done: bool = False  # [DONE] came
    usage_sent: bool = False
    broke: bytes = b""  # an error event the engine streamed (held back)
    migrations: int = 0
    _buf: bytes = b""

    @classmethod
    def of(cls, body: dict[str, Any], path: str) -> Answer:
        whole = body.get("stream") is not True
        usage = whole or bool((body.get("stream_options") or {}).get("include_usage"))
        chat = path == CHAT
        limit = body.get("max_tokens")
        if chat:
            limit = body.get("max_completion_tokens") or limit
        keep = body.get("return_token_ids") is True
        logprobs = not chat and body.get("logprobs") is not None
        return cls(chat=chat, keep_ids=keep, usage_asked=usage, limit=limit, whole=whole, logprobs=logprobs)

    def __post_init__(self) -> None:
        if _NativeFeed is not None:
            self._native = _NativeFeed(self.keep_ids)

    def feed(self, chunk: bytes, *, continued: bool = False) -> bytes:
        """The whole events of `chunk` (after what came before it) as the client gets them; an
        event of a continuation (`continued`) rewritten into the client's answer."""
        fast = self._fast
        if fast is not None and not continued and not self._buf:
            out = fast(chunk)
            if out is not None:
                return out  # type: ignore[no-any-return]
        buf = self._buf + chunk if self._buf else chunk
        end = buf.rfind(b"\n\n")
        if end < 0:
            self._buf = buf
            return b""
        whole = buf if end + 2 == len(buf) else buf[: end + 2]
        self._buf = b"" if whole is buf else buf[end + 2 :]
        if not continued:
            if self._native is not None:
                self._native.push(whole)
            else:
                self._recent.append(whole)
            if self.head and not (self.logprobs or self.broke):
                if whole.rfind(b"\n\n", 0, len(whole) - 2) < 0:  # one event: the usual read
                    return self._plain(whole)
                return b"".join(self._plain(ev + b"\n\n") for ev in buf[:end].split(b"\n\n") if ev)
        event = self._continued if continued else self._event
        return b"".join(event(ev) for ev in buf[:end].split(b"\n\n") if ev)

    def _plain(self, ev: bytes) -> bytes:
        """A whole event of the first leg after its first, read as bytes (the cheap path, for
        every token of every answer that may move, so no scan of the whole event): its ids found
        from its end and kept as written (read as numbers when asked for), and taken out unless
        the client asked for them. An event without ids ([DONE], usage, an error) is read whole.
        Its finish reason and usage are looked for only when the leg ends (`settle`)."""
        at = ev.rfind(_IDS_AT)
        if at < 0:
            return self._event(ev[:-2])
        end = ev.index(b"]", at)
        if self._native is not None and (took := self._native.take_ids()):
            self._unread.append(took)  # the ids the native reads took come first
        self._unread.append(ev[at + len(_IDS_AT) : end])
        if self.keep_ids:
            return ev
        if ev.endswith(_NO_PROMPT_IDS, 0, at):  # a completion's: right before the ids
            at -= len(_NO_PROMPT_IDS)
        tail = ev[end + 1 :]  # the event's last fields
        if _PROMPT_IDS_KEY in tail:  # a chat's, after its choices
            tail = _IDS.sub(b"", tail)
        return ev[:at] + tail

    def settle(self) -> None:
        """The first leg's finish and usage, which its cheap path does not look for: read off its
        last reads (after a finish reason come only the usage and [DONE]) once it ended ([DONE])
        or broke."""
        if self._resumed:
            return
        for events in self._reads():
            if _FINISHED in events:
                self.finished = True
            if b'"usage":{' in events:
                self.usage_sent = True

    @property
    def prompt_ids(self) -> list[int] | None:
        """The prompt's token ids as the engine read them (its first event), None before it."""
        if self._prompt_ids is None and self._prompt_raw is not None:
            self._prompt_ids = _numbers(self._prompt_raw)
        return self._prompt_ids

    @property
    def ids(self) -> list[int]:
        """The answer's token ids so far."""
        if self._native is not None and (took := self._native.take_ids()):
            self._unread.append(took)  # read after those in `_unread`
        if self._unread:
            text = b",".join(self._unread)
            self._unread.clear()
            self._ids.extend(_numbers(text))
        return self._ids

    def _trailing_silent(self) -> int:
        """How many of the first leg's last tokens brought no text (a character's first bytes)."""
        silent = 0
        for events in reversed(self._reads()):
            for ev in reversed(events.split(b"\n\n")):
                m = _TOKEN_IDS.search(ev)
                if m is None:
                    continue
                if not any(x in ev for x in _NO_TEXT):
                    return silent
                silent += len([t for t in m[1].split(b",") if t.strip()])
        return silent

    def _event(self, ev: bytes) -> bytes:
        """An event of the first leg: its ids read (and taken out unless asked for), the rest as is;
        from an error event on, nothing (the answer goes on elsewhere)."""
        if (passed := self._passing(ev)) is not None:
            return passed
        whole_ev = ev
        at = ev.find(_PROMPT_IDS_AT)
        end = ev.find(b"]", at) if at >= 0 else -1
        if end > 0:  # the first event's: kept as written, cut out (a list of ids has no other "]")
            self._prompt_raw, self._prompt_ids = ev[at + len(_PROMPT_IDS_AT) : end], None
            ev = ev[:at] + ev[end + 1 :]
        if not self.head or self.logprobs:  # (a chunk with logprobs is read whole)
            data = json.loads(ev[6:])
            if not self.head:
                self._read_head(data)
            for c in data.get("choices") or ():
                self._offsets(c.get("logprobs"), shift=False)
        for m in _IDS.finditer(ev):  # (the prompt's ids were cut out above: only `null` is left of them)
            if m[1] == b"token_ids" and m[2] != b"null":
                self.ids.extend(_numbers(m[2][1:-1]))
        if _FINISHED in ev:
            self.finished = True
        if b'"usage":{' in ev:
            self.usage_sent = True
        return (_IDS.sub(b"", ev) if not self.keep_ids else whole_ev) + b"\n\n"

    def _passing(self, ev: bytes) -> bytes | None:
        """What goes to the client of an event that carries no tokens: nothing from an error event
        on (held back in `broke`), [DONE] and comments as they are; None for a data event."""
        if self.broke or _is_error(ev):
            self.broke = self.broke or ev
            self._fast = None
            return b""
        if not ev.startswith(b"data: {"):
            if ev == _DONE:
                self.done = True
                self.settle()
            return ev + b"\n\n"
        return None

    def _offsets(self, logprobs: Any, *, shift: bool) -> None:
        """A completion's logprobs: shifted by the text the answer had before this leg (`shift`),
        and where the next token's text begins after them."""
        if not isinstance(logprobs, dict) or not logprobs.get("tokens"):
            return
        if shift:
            logprobs["text_offset"] = [o + self.base for o in logprobs["text_offset"]]
        self.offset = logprobs["text_offset"][-1] + len(logprobs["tokens"][-1])

    def _read_head(self, data: dict[str, Any]) -> None:
        self.head = {k: data[k] for k in ("id", "created", "model") if k in data}
        if self._native is not None and self.head and not (self.logprobs or self.broke):
            self._fast = self._native.feed

    def _reads(self) -> list[bytes]:
        """The last reads of the first leg, oldest first."""
        return self._native.recent() if self._native is not None else list(self._recent)  # type: ignore[no-any-return]

    def resumable(self) -> bool:
        """The stream broke where a continuation can take it up: ids known, not finished."""
        self.settle()
        return self._prompt_raw is not None and not self.finished and not self.done

    def complete(self) -> bool:
        """Every token of the answer came (its end may not have)."""
        self.settle()
        return self.finished or (self.limit is not None and len(self.ids) >= self.limit)

    def continuation(self, body: dict[str, Any], path: str) -> tuple[bytes, dict[str, Any]]:
        """The request that goes on with this answer: a completion of the prompt's ids and the
        answer's so far, with the rest of `max_tokens` (the answer is not complete).

        It ends where the client's text ends: tokens whose text has not come (a character's
        first bytes) are generated again, their chunks not sent twice. (An engine primed with a
        prompt that ends inside a character sends the whole prompt's text with the character's
        last byte: tokenizers' DecodeStream.)"""
        assert self.prompt_ids is not None
        if not self._resumed:  # the first leg's events were not read one by one
            self.silent, self._resumed = self._trailing_silent(), True
        k = len(self.ids) - self.silent
        del self.ids[k:]
        self.skip, self.silent = self.silent, 0
        self.base = self.offset
        if path == CHAT:
            cont = {name: body[name] for name in _CHAT_SAMPLING if name in body}
        else:
            cont = {name: v for name, v in body.items() if name not in _NOT_CARRIED}
        if self.limit is not None:
            cont["max_tokens"] = self.limit - k
        if body.get("min_tokens"):
            cont["min_tokens"] = max(0, int(body["min_tokens"]) - k)
        cont.update(prompt=self.prompt_ids + self.ids, stream=True, return_token_ids=True)
        return json.dumps(cont, separators=(",", ":")).encode(), cont

    def _continued(self, ev: bytes) -> bytes:
        """An event of a continuation (a streamed completion) as an event of the client's answer."""
        if (passed := self._passing(ev)) is not None:
            return passed
        data = json.loads(ev[6:])
        choices = [c for c in map(self._choice, data.get("choices") or ()) if c is not None]
        if data.get("choices") and not choices:
            return b""  # tokens the client had: generated again
        out: dict[str, Any] = {
            **data,
            **self.head,
            "object": "chat.completion.chunk" if self.chat else "text_completion",
            "choices": choices,
        }
        if data.get("usage") is not None:
            out["usage"] = self.usage()
            self.usage_sent = True
        out.pop("prompt_token_ids", None)
        return _sse(out)

    def _choice(self, c: dict[str, Any]) -> dict[str, Any] | None:
        """A continuation's choice as the client's, None for one of tokens the client had."""
        ids = c.get("token_ids") or []
        self.ids.extend(ids)
        if self.skip and ids:  # generated again: the client has them, and they brought no text
            had = min(self.skip, len(ids))
            self.skip -= had
            ids = ids[had:]
            lp = c.get("logprobs")
            if isinstance(lp, dict):
                c["logprobs"] = {k: v[had:] if isinstance(v, list) else v for k, v in lp.items()}
            if not ids and not c.get("text") and not c.get("finish_reason"):
                return None
        if ids:
            self.silent = 0 if c.get("text") else self.silent + len(ids)
        if c.get("finish_reason"):
            self.finished = True
        if self.chat:
            out = {
                "index": 0,
                "delta": {"content": c.get("text", "")},
                "logprobs": None,
                "finish_reason": c.get("finish_reason"),
                "stop_reason": c.get("stop_reason"),
            }
        else:
            out = {k: v for k, v in c.items() if k not in ("prompt_token_ids", "token_ids")}
            out["index"] = 0
            self._offsets(out.get("logprobs"), shift=True)
        if self.keep_ids:
            out["token_ids"] = ids
        return out

    def usage(self) -> dict[str, int]:
        """The whole answer's usage: the prompt once, every leg's tokens."""
        raw = self._prompt_raw
        prompt = raw.count(b",") + 1 if raw and raw.strip() else 0
        done = len(self.ids)
        return {"prompt_tokens": prompt, "total_tokens": prompt + done, "completion_tokens": done}

    def ending(self) -> bytes:
        """What a complete answer whose stream broke still owes the client: its finish reason
        (it came to its length), the usage chunk where asked, and [DONE]."""
        out = b""
        if not self.finished:
            choice: dict[str, Any] = {"index": 0, "finish_reason": "length", "stop_reason": None}
            choice["logprobs"] = None
            if self.chat:
                choice["delta"] = {}
            else:
                choice["text"] = ""
            out += self._chunk([choice], None)
        if self.usage_asked and not self.usage_sent:
            out += self._chunk([], self.usage())
        return out + (b"" if self.done else _DONE + b"\n\n")

    def _chunk(self, choices: list[dict[str, Any]], usage: dict[str, int] | None) -> bytes:
        obj = "chat.completion.chunk" if self.chat else "text_completion"
        return _sse({**self.head, "object": obj, "choices": choices, "usage": usage})


def _numbers(listed: bytes) -> list[int]:
    """The ids of a JSON list's inside as vLLM writes it (`1,2,3` or `1, 2, 3`; empty: none)."""
    return [int(t) for t in listed.split(b",") if t.strip()]


def _is_error(ev: bytes) -> bool:
    """An error event as vLLM streams one (`{"error": ...}`, or the older `"object":"error"`)."""
    return ev.startswith(_ERROR[0]) or _ERROR[1] in ev[:40]


def _sse(data: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(data, separators=(",", ":")).encode() + b"\n\n"
