"""The simulator's answers (sim/replies.py): a streamed chunk built from the pre-encoded frame is
the chunk itself, the usage counts the prompt once, each token's text is decoded once, and the
error bodies are vLLM's."""

from __future__ import annotations

import json

import pytest

from ucmctl.sim.engine import SimRequest
from ucmctl.sim.replies import Decoder, Reply, error_reply, internal_error_reply, usage
from ucmctl.sim.tokens import WordTokenizer


class CountingTokenizer(WordTokenizer):
    def __init__(self) -> None:
        self.calls: list[list[int]] = []

    def decode(self, ids: list[int]) -> str:
        self.calls.append(list(ids))
        return super().decode(ids)


def _reply(chat: bool) -> Reply:
    return Reply(id="cmpl-1", model="m", chat=chat, created=7, kv_transfer_params=None)


@pytest.mark.parametrize("chat", [False, True], ids=["completion", "chat"])
@pytest.mark.parametrize("last", [False, True], ids=["more", "last"])
@pytest.mark.parametrize("ids", [False, True], ids=["text", "token-ids"])
def test_the_token_frame_filled_in_is_the_chunk(chat: bool, last: bool, ids: bool) -> None:
    ctx = _reply(chat)
    ctx.return_token_ids = ids
    head, middle, before_id, tail = ctx.token_frame()
    text = ' "quoted" \\ é'
    finish = b'"length"' if last else b"null"
    built = head + json.dumps(text).encode() + middle + finish + before_id + (b"42" if ids else b"") + tail
    delta = ctx.delta(0, text, last)
    if ids:  # vLLM's return_token_ids: the token's id in each chunk (a completion's: after the prompt's)
        delta.update({"prompt_token_ids": None, "token_ids": [42]} if not chat else {"token_ids": [42]})
    assert built == ctx.sse([delta])
    chunk = json.loads(built[len(b"data: ") :])
    assert chunk["object"] == ("chat.completion.chunk" if chat else "text_completion")
    assert chunk["choices"][0]["finish_reason"] == ("length" if last else None)
    assert chunk["choices"][0].get("token_ids") == ([42] if ids else None)


def test_usage_counts_the_prompt_once_and_every_choice() -> None:
    first = SimRequest(
        request_id="r",
        prompt=[1, 2, 3, 4],
        max_tokens=5,
        keys=[],
        generated=5,
        local_hit_tokens=2,
        external_hit_tokens=1,
    )
    other = SimRequest(request_id="r-1", prompt=[1, 2, 3, 4], max_tokens=5, keys=[], generated=3)
    assert usage(first, [other]) == {
        "prompt_tokens": 4,
        "total_tokens": 12,
        "completion_tokens": 8,
        "prompt_tokens_details": {"cached_tokens": 3},
    }
    assert usage(other)["prompt_tokens_details"] is None


def test_a_token_s_text_is_decoded_once() -> None:
    tokenizer = CountingTokenizer()
    decoder = Decoder(tokenizer)
    assert [decoder.piece(5), decoder.piece(5), decoder.piece(6)] == [" w5", " w5", " w6"]
    assert decoder.decode([5, 6]) == " w5 w6"
    assert tokenizer.calls == [[5], [6], [5, 6]]


def test_error_bodies_are_vllm_s() -> None:
    bad = error_reply("too long", "max_tokens")
    assert bad.status == 400
    assert json.loads(bad.text or "") == {
        "error": {"message": "too long", "type": "BadRequestError", "param": "max_tokens", "code": 400}
    }
    missing = error_reply("no such model", "model", 404)
    assert missing.status == 404 and json.loads(missing.text or "")["error"]["type"] == "NotFoundError"
    failed = internal_error_reply()
    assert failed.status == 500
    assert json.loads(failed.text or "")["error"] == {
        "message": "Internal server error",
        "type": "InternalServerError",
        "param": None,
        "code": 500,
    }
