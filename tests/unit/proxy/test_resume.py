"""Mid-stream migration's pure part (ucmctl.proxy.resume): which answers can go on, the token ids
read off vLLM's stream, the continuation request, and its events rewritten into the answer."""

from __future__ import annotations

import json
from typing import Any

import pytest

from ucmctl.proxy.resume import Answer, refusal, with_token_ids
from ucmctl.proxy.rewrite import CHAT, COMPLETIONS


def sse(data: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(data, separators=(",", ":")).encode() + b"\n\n"


def cmpl_chunk(
    text: str, ids: list[int], prompt: list[int] | None = None, finish: str | None = None
) -> bytes:
    """A completion chunk as vLLM 0.32 writes it with return_token_ids."""
    choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish, "stop_reason": None,
              "prompt_token_ids": prompt, "token_ids": ids}  # fmt: skip
    return sse({"id": "cmpl-1", "object": "text_completion", "created": 7, "model": "m", "choices": [choice]})


def chat_first(prompt: list[int]) -> bytes:
    choice = {"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None}
    choice["finish_reason"] = None
    return sse({"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 7, "model": "m",
                "choices": [choice], "prompt_token_ids": prompt})  # fmt: skip


def chat_chunk(text: str, ids: list[int], finish: str | None = None) -> bytes:
    choice = {"index": 0, "delta": {"content": text}, "logprobs": None, "finish_reason": finish}
    choice["token_ids"] = ids
    return sse({"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 7, "model": "m",
                "choices": [choice]})  # fmt: skip


def events(raw: bytes) -> list[Any]:
    return [json.loads(e[6:]) if e.startswith(b"data: {") else e.decode() for e in raw.split(b"\n\n") if e]


@pytest.mark.parametrize(
    ("body", "path", "why"),
    [
        ({"prompt": "x", "n": 2}, COMPLETIONS, "n > 1"),
        ({"prompt": "x", "best_of": 3}, COMPLETIONS, "n > 1"),
        ({"messages": [], "response_format": {"type": "json_object"}}, CHAT, "guided decoding"),
        ({"prompt": "x", "structured_outputs": {"regex": "a+"}}, COMPLETIONS, "guided decoding"),
        ({"messages": [], "tools": [{"type": "function"}]}, CHAT, "tool calls"),
        ({"prompt": "x", "echo": True}, COMPLETIONS, "echo"),
        ({"prompt": "x", "frequency_penalty": 0.5}, COMPLETIONS, "penalty"),
        ({"prompt": "x", "stop": ["\n\n"]}, COMPLETIONS, "stop strings"),
        ({"messages": [], "logprobs": True}, CHAT, "logprobs"),
        ({"prompt": ["a", "b"]}, COMPLETIONS, "several prompts"),
        ({"prompt": "x", "stream_options": {"include_usage": True}}, COMPLETIONS, "stream_options without"),
    ],
)
def test_an_answer_that_cannot_go_on_faithfully_says_why(body: dict[str, Any], path: str, why: str) -> None:
    assert why in (refusal(body, path) or "")


def test_plain_answers_can_go_on() -> None:
    plain = {"prompt": [1, 2], "n": 1, "temperature": 0, "logprobs": 2, "stop": []}
    assert refusal(plain, COMPLETIONS) is None
    tools_off = {"messages": [], "tools": [{"type": "function"}], "tool_choice": "none"}
    assert refusal(tools_off, CHAT) is None
    usage = {"include_usage": True}
    assert refusal({"prompt": "x", "stream": True, "stream_options": usage}, COMPLETIONS) is None
    raw, leg = with_token_ids({"prompt": "x", "stream": True})
    assert json.loads(raw) == leg == {"prompt": "x", "stream": True, "return_token_ids": True}


def test_a_read_of_several_events_ending_before_done_leaves_the_answer_complete() -> None:
    """The cheap path finds each event's ids from its end; the finish and the usage of a leg that
    broke before [DONE] are read off its last reads."""
    a = Answer.of({"prompt": "x", "max_tokens": 50, "stream": True}, COMPLETIONS)
    a.feed(cmpl_chunk(" a", [11], prompt=[1, 2]))
    usage = sse({"id": "cmpl-1", "object": "text_completion", "created": 7, "model": "m", "choices": [],
                 "usage": {"prompt_tokens": 2, "completion_tokens": 3, "total_tokens": 5}})  # fmt: skip
    out = a.feed(cmpl_chunk(" b", [12]) + cmpl_chunk(" c", [13], finish="stop") + usage)
    assert a.ids == [11, 12, 13] and b"token_ids" not in out and not a.done
    assert [e["choices"][0]["finish_reason"] for e in events(out)[:2]] == [None, "stop"]
    assert events(out)[2]["usage"]["total_tokens"] == 5
    assert a.complete() and not a.resumable() and a.usage_sent
    assert a.ending() == b"data: [DONE]\n\n"  # only its end was lost


def test_a_chat_answers_ids_are_taken_out_wherever_its_null_prompt_ids_stand() -> None:
    a = Answer.of({"messages": [], "stream": True}, CHAT)
    a.feed(chat_first([5, 6]))
    late = chat_chunk(" y", [22])[:-3] + b',"prompt_token_ids":null}\n\n'  # after the choices
    out = a.feed(chat_chunk(" x", [21]) + late)
    assert a.prompt_ids == [5, 6] and a.ids == [21, 22]
    assert b"token_ids" not in out
    assert [e["choices"][0]["delta"]["content"] for e in events(out)] == [" x", " y"]


def test_an_error_event_in_a_read_of_tokens_is_held_back() -> None:
    a = Answer.of({"prompt": "x", "stream": True}, COMPLETIONS)
    a.feed(cmpl_chunk(" a", [11], prompt=[1]))
    error = b'data: {"error":{"message":"engine dead","code":500}}\n\n'
    out = a.feed(cmpl_chunk(" b", [12]) + error)
    assert a.ids == [11, 12] and a.broke.startswith(b'data: {"error"') and b"engine dead" not in out
    assert events(out)[0]["choices"][0]["text"] == " b" and a.resumable()


def test_the_ids_are_read_off_the_stream_and_taken_out_where_not_asked_for() -> None:
    a = Answer.of({"prompt": "x", "max_tokens": 9, "stream": True}, COMPLETIONS)
    raw = cmpl_chunk(" a", [11], prompt=[1, 2, 3]) + cmpl_chunk(" b", [12]) + cmpl_chunk(" c", [13, 14])
    # cut anywhere: only whole events go to the client
    out = a.feed(raw[:50]) + a.feed(raw[50:230]) + a.feed(raw[230:])
    assert a.prompt_ids == [1, 2, 3] and a.ids == [11, 12, 13, 14]
    assert b"token_ids" not in out
    assert [e["choices"][0]["text"] for e in events(out)] == [" a", " b", " c"]
    assert events(out)[0]["choices"][0] == {"index": 0, "text": " a", "logprobs": None, "finish_reason": None,
                                            "stop_reason": None}  # fmt: skip
    assert a.head == {"id": "cmpl-1", "created": 7, "model": "m"}
    assert a.resumable() and not a.complete()
    kept = Answer.of({"prompt": "x", "return_token_ids": True}, COMPLETIONS)
    assert kept.feed(raw) == raw  # asked for: the bytes as they came
    a.feed(cmpl_chunk("", [15], finish="length") + b"data: [DONE]\n\n")
    assert a.finished and a.done and not a.resumable()


def test_an_error_event_is_held_back_for_the_continuation() -> None:
    a = Answer.of({"prompt": "x"}, COMPLETIONS)
    error = sse({"error": {"message": "EngineDeadError", "code": 500}})
    out = a.feed(cmpl_chunk(" a", [11], prompt=[1]) + error + b"data: [DONE]\n\n")
    assert events(out) and b"error" not in out and b"[DONE]" not in out
    assert a.broke == error[:-2] and not a.done


def test_the_continuation_of_a_completion_asks_for_the_rest() -> None:
    body = {"model": "m", "prompt": "hi", "max_tokens": 10, "min_tokens": 4, "temperature": 0.7, "seed": 3,
            "cache_salt": "s1", "echo": False, "n": 1, "stream": True, "kv_transfer_params": {"x": 1},
            "stream_options": {"include_usage": True}, "logprobs": 2}  # fmt: skip
    a = Answer.of(body, COMPLETIONS)
    a.feed(cmpl_chunk(" a", [11], prompt=[1, 2]) + cmpl_chunk(" b", [12]) + cmpl_chunk(" c", [13]))
    raw, cont = a.continuation(body, COMPLETIONS)
    assert json.loads(raw) == cont
    assert cont == {"model": "m", "prompt": [1, 2, 11, 12, 13], "max_tokens": 7, "min_tokens": 1,
                    "temperature": 0.7, "seed": 3, "cache_salt": "s1", "stream": True,
                    "stream_options": {"include_usage": True}, "logprobs": 2,
                    "return_token_ids": True}  # fmt: skip


def test_the_continuation_of_a_chat_is_a_completion_of_the_templated_ids() -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": 5,
            "max_tokens": 99, "temperature": 0, "stream": True, "chat_template_kwargs": {"x": 1}}  # fmt: skip
    a = Answer.of(body, CHAT)
    out = a.feed(chat_first([5, 6, 7]) + chat_chunk("He", [40]) + chat_chunk("llo", [41]))
    assert b"prompt_token_ids" not in out and b"token_ids" not in out
    _, cont = a.continuation(body, CHAT)
    assert cont == {"model": "m", "temperature": 0, "max_tokens": 3, "prompt": [5, 6, 7, 40, 41],
                    "stream": True, "return_token_ids": True}  # fmt: skip


def test_the_continuations_events_become_the_answers() -> None:
    a = Answer.of({"messages": [], "stream": True, "stream_options": {"include_usage": True}}, CHAT)
    a.feed(chat_first([5, 6, 7]) + chat_chunk("He", [40]))
    other = cmpl_chunk(" there", [42], prompt=[5, 6, 7, 40]).replace(b"cmpl-1", b"cmpl-2")
    other = other.replace(b":7,", b":9,")
    usage = sse({"id": "cmpl-2", "object": "text_completion", "created": 9, "model": "m", "choices": [],
                 "usage": {"prompt_tokens": 4, "completion_tokens": 2, "total_tokens": 6}})  # fmt: skip
    out = a.feed(other + cmpl_chunk("!", [43], finish="length") + usage + b"data: [DONE]\n\n", continued=True)
    got = events(out)
    assert [e["id"] for e in got[:3]] == ["chatcmpl-1"] * 3 and {e["created"] for e in got[:3]} == {7}
    assert all(e["object"] == "chat.completion.chunk" for e in got[:3])
    assert got[0]["choices"] == [{"index": 0, "delta": {"content": " there"}, "logprobs": None,
                                  "finish_reason": None, "stop_reason": None}]  # fmt: skip
    assert got[1]["choices"][0]["finish_reason"] == "length"
    # the whole answer's usage: the prompt once, every leg's tokens
    assert got[2]["usage"] == {"prompt_tokens": 3, "completion_tokens": 3, "total_tokens": 6}
    assert got[3] == "data: [DONE]" and a.done and a.ids == [40, 42, 43]
    assert b"prompt_token_ids" not in out and b"token_ids" not in out


def test_an_answer_complete_but_its_end_owes_the_client_its_end() -> None:
    a = Answer.of({"prompt": "x", "max_tokens": 2, "stream_options": {"include_usage": True}}, COMPLETIONS)
    a.feed(cmpl_chunk(" a", [11], prompt=[1]) + cmpl_chunk(" b", [12]))
    assert a.complete() and not a.finished  # every token came, not its finish reason
    got = events(a.ending())
    assert got[0]["choices"] == [{"index": 0, "finish_reason": "length", "stop_reason": None,
                                  "logprobs": None, "text": ""}]  # fmt: skip
    assert got[1]["usage"] == {"prompt_tokens": 1, "completion_tokens": 2, "total_tokens": 3}
    assert got[2] == "data: [DONE]" and got[0]["id"] == "cmpl-1"


def lp_chunk(text: str, ids: list[int], offsets: list[int], prompt: list[int] | None = None) -> bytes:
    """A completion chunk with logprobs (vLLM's: text offsets from the answer's start)."""
    raw = json.loads(cmpl_chunk(text, ids, prompt)[6:])
    logprobs = {"text_offset": offsets, "token_logprobs": [-0.5] * len(ids), "tokens": [text] * len(ids),
                "top_logprobs": [{text: -0.5}] * len(ids)}  # fmt: skip
    raw["choices"][0]["logprobs"] = logprobs
    return sse(raw)


def test_a_completions_logprobs_go_on_with_their_text_offsets() -> None:
    a = Answer.of({"prompt": "x", "logprobs": 1}, COMPLETIONS)
    a.feed(lp_chunk(" ab", [11], [0], prompt=[1]) + lp_chunk(" c", [12], [3]))
    assert a.offset == 5  # the next token's text starts after " ab c"
    a.continuation({"prompt": "x", "logprobs": 1}, COMPLETIONS)
    # the continuation counts from its own start: shifted by the text before it, chunk after chunk
    out = a.feed(lp_chunk(" d", [13], [0]) + lp_chunk("ef", [14], [2]), continued=True)
    assert [e["choices"][0]["logprobs"]["text_offset"] for e in events(out)] == [[5], [7]]
    assert a.offset == 9


def test_a_character_cut_in_the_middle_is_generated_again_not_its_prompt() -> None:
    """Two tokens of a three-byte character came (no text yet) when the stream broke: the
    continuation ends before them (an engine primed inside a character sends the whole prompt's
    text), and their chunks, generated again, do not reach the client twice."""
    body = {"prompt": "x", "max_tokens": 10, "return_token_ids": True}
    a = Answer.of(body, COMPLETIONS)
    for chunk in (cmpl_chunk(" a", [11], prompt=[1, 2]), cmpl_chunk("", [161]), cmpl_chunk("", [227])):
        a.feed(chunk)  # one by one: the later ones take the cheap path (bytes, read when needed)
    _, cont = a.continuation(body, COMPLETIONS)
    assert cont["prompt"] == [1, 2, 11] and cont["max_tokens"] == 9 and a.ids == [11]
    again = cmpl_chunk("", [161], prompt=[1, 2, 11]) + cmpl_chunk("", [227]) + cmpl_chunk("€", [108])
    got = events(a.feed(again + cmpl_chunk(" b", [12]), continued=True))
    shown = [(e["choices"][0]["text"], e["choices"][0]["token_ids"]) for e in got]
    assert shown == [("€", [108]), (" b", [12])]
    assert a.ids == [11, 161, 227, 108, 12] and a.skip == 0 and a.silent == 0


@pytest.mark.parametrize("keep", [False, True])
def test_the_first_events_prompt_ids_are_read_as_written_whatever_their_spacing(keep: bool) -> None:
    # vLLM writes compact lists; a JSON writer with spaces (as Python's json.dumps default) too
    first = cmpl_chunk("Hi", [42], prompt=[5, 6, 7]).replace(b"[5,6,7]", b"[5, 6,  7]")
    a = Answer.of({"prompt": [5, 6, 7], "stream": True, "return_token_ids": keep}, COMPLETIONS)
    out = a.feed(first)
    assert a.prompt_ids == [5, 6, 7] and a.ids == [42] and a.resumable()
    assert a.usage() == {"prompt_tokens": 3, "total_tokens": 4, "completion_tokens": 1}
    if keep:
        assert out == first  # as the engine wrote it, ids and all
    else:
        (got,) = events(out)
        assert "prompt_token_ids" not in got["choices"][0] and "token_ids" not in got["choices"][0]
        assert got["choices"][0]["text"] == "Hi" and got["id"] == "cmpl-1"


def test_an_empty_prompt_ids_list_is_no_prompt_token() -> None:
    a = Answer.of({"messages": [], "stream": True}, CHAT)
    a.feed(chat_first([]))
    assert a.prompt_ids == [] and a.usage()["prompt_tokens"] == 0 and a.resumable()
