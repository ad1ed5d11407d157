"""A whole answer assembled from the stream the proxy asked for (ucmctl.proxy.whole), checked
against what `vllm serve` 0.32 itself answers whole for the same request: the bytes of both in
data/ (recorded from the real engine: the tiny model, greedy)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from ucmctl.proxy import whole
from ucmctl.proxy.resume import Answer, with_token_ids
from ucmctl.proxy.rewrite import CHAT, COMPLETIONS

RECORDED = json.loads((Path(__file__).parent / "data" / "vllm-0.32-whole-and-streamed.json").read_text())


def _through(kind: str, path: str, request: dict[str, Any]) -> tuple[dict[str, Any], Answer]:
    """The recorded stream fed as the request path feeds it, then assembled."""
    answer = Answer.of(request, path)
    _, leg = with_token_ids(whole.streamed(request))
    assert (
        leg["stream"] is True and leg["stream_options"] == {"include_usage": True} and leg["return_token_ids"]
    )
    body = whole.Body(answer)
    stream = RECORDED[kind]["stream"].encode()
    for at in range(0, len(stream), 97):  # reads that cut events anywhere
        body._events.append(answer.feed(stream[at : at + 97]))
    return body.body(), answer


@pytest.mark.parametrize("ids", [True, False])
def test_a_completion_assembled_is_the_engines_whole_answer(ids: bool) -> None:
    request = (
        {**RECORDED["completion"]["request"], "return_token_ids": True}
        if ids
        else RECORDED["completion"]["request"]
    )
    got, answer = _through("completion", COMPLETIONS, request)
    want = dict(RECORDED["completion"]["whole"])  # answered with return_token_ids
    assert answer.whole and answer.usage_asked
    if not ids:
        want["choices"] = [{**want["choices"][0], "token_ids": None, "prompt_token_ids": None}]
    assert {k: v for k, v in got.items() if k not in ("id", "created")} == {
        k: v for k, v in want.items() if k not in ("id", "created")
    }
    assert got["id"].startswith("cmpl-") and isinstance(got["created"], int)
    assert list(got) == list(want)  # and in the engine's order


def test_a_chat_assembled_is_the_engines_whole_answer() -> None:
    got, _ = _through("chat", CHAT, RECORDED["chat"]["request"])
    want = RECORDED["chat"]["whole"]
    assert got["choices"][0]["message"]["content"] == want["choices"][0]["message"]["content"] != ""
    assert {k: v for k, v in got.items() if k not in ("id", "created")} == {
        k: v for k, v in want.items() if k not in ("id", "created")
    }
    assert got["id"].startswith("chatcmpl-") and list(got) == list(want)


def test_a_whole_answer_that_broke_says_why_and_nothing_of_it() -> None:
    body = whole.Body(Answer.of({"prompt": [1, 2], "max_tokens": 4}, COMPLETIONS))
    body.fail("decode instance http://d:1 failed mid-stream (ClientPayloadError): ...")
    assert body.failed is not None and "failed mid-stream" in body.failed
