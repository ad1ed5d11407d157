"""The native read of an answer's token ids (csrc/sse_ids.cpp, `ucmctl.proxy._sse`) against the
Python one it stands in for: for any stream of vLLM's events (completions and chats, ids kept or
not, an error, a split character, [DONE]) cut into any reads, the client gets the same bytes and
the answer knows the same ids, end and state, and a cut answer asks for the same continuation."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ucmctl.proxy import resume
from ucmctl.proxy.resume import Answer
from ucmctl.proxy.rewrite import CHAT, COMPLETIONS

from .test_resume import chat_chunk, chat_first, cmpl_chunk, sse

pytestmark = pytest.mark.skipif(resume._NativeFeed is None, reason="the native module is not built")

USAGE = {"prompt_tokens": 3, "total_tokens": 9, "completion_tokens": 6}


def _stream(chat: bool, tokens: list[tuple[str, list[int]]], end: str) -> bytes:
    """An answer's events as vLLM 0.32 writes them with return_token_ids."""
    out = chat_first([1, 2, 3]) if chat else b""
    for n, (text, ids) in enumerate(tokens):
        finish = "length" if end != "cut" and n == len(tokens) - 1 else None
        if chat:
            out += chat_chunk(text, ids, finish)
        else:
            out += cmpl_chunk(text, ids, prompt=[1, 2, 3] if n == 0 else None, finish=finish)
    if end == "error":
        out += sse({"error": {"message": "EngineDeadError", "code": 500}})
    elif end == "done":
        obj = "chat.completion.chunk" if chat else "text_completion"
        out += sse({"id": "x-1", "object": obj, "created": 7, "model": "m", "choices": [], "usage": USAGE})
        out += b"data: [DONE]\n\n"
    return out


def _python_only(a: Answer) -> Answer:
    a._native = None
    return a


def _reads(raw: bytes, groups: list[int], cut: int | None) -> list[bytes]:
    """The stream as reads of whole events (`groups`: how many in each, as the engine flushes
    them), one of them cut at byte `cut` where given."""
    events = [e + b"\n\n" for e in raw.split(b"\n\n") if e]
    reads, at = [], 0
    for n in [*groups, len(events)]:
        if at < len(events):
            reads.append(b"".join(events[at : at + n]))
            at += n
    if cut is not None and reads:
        i = cut % len(reads)
        k = cut % max(1, len(reads[i]))
        reads[i : i + 1] = [r for r in (reads[i][:k], reads[i][k:]) if r]
    return reads


def _read(a: Answer, reads: list[bytes]) -> bytes:
    return b"".join(a.feed(r) for r in reads)


def _state(a: Answer) -> tuple[Any, ...]:
    return (list(a.ids), a.prompt_ids, a.head, a.finished, a.done, a.usage_sent, a.broke, a.resumable(),
            a.complete())  # fmt: skip


tokens = st.lists(
    st.tuples(
        st.sampled_from(["", " a", "é", "bc", " word"]),
        st.lists(st.integers(0, 99999), min_size=1, max_size=3),
    ),
    min_size=1,
    max_size=12,
)


@settings(max_examples=300, deadline=None)
@given(
    chat=st.booleans(),
    keep=st.booleans(),
    toks=tokens,
    end=st.sampled_from(["cut", "done", "error"]),
    groups=st.lists(st.integers(1, 3), max_size=12),
    cut=st.none() | st.integers(0, 10_000),
)
def test_the_native_read_is_the_python_one(
    chat: bool, keep: bool, toks: list[tuple[str, list[int]]], end: str, groups: list[int], cut: int | None
) -> None:
    path = CHAT if chat else COMPLETIONS
    body: dict[str, Any] = {"model": "m", "max_tokens": 50, "stream": True, "return_token_ids": keep}
    body |= {"messages": [{"role": "user", "content": "hi"}]} if chat else {"prompt": "hi"}
    raw = _stream(chat, toks, end)
    native, python = Answer.of(body, path), _python_only(Answer.of(body, path))
    assert native._native is not None
    reads = _reads(raw, groups, cut)
    assert _read(native, reads) == _read(python, reads)
    assert _state(native) == _state(python)
    if native.resumable():
        assert native.continuation(body, path) == python.continuation(body, path)
        assert native.skip == python.skip


def test_the_common_read_is_the_native_ones() -> None:
    """Once the answer's head is known, a read of whole events with their ids does not go
    through Python's reading at all (its ids and last reads are kept in C)."""
    a = Answer.of({"prompt": "x", "stream": True}, COMPLETIONS)
    a.feed(cmpl_chunk(" a", [11], prompt=[1, 2]))
    assert a._fast is not None
    out = a.feed(cmpl_chunk(" b", [12]) + cmpl_chunk(" c", [13]))
    assert b"token_ids" not in out and a._unread == [] and a.ids == [11, 12, 13]
    assert len(a._reads()) == 2 and a._reads()[-1].endswith(b'"token_ids":[13]}]}\n\n')
