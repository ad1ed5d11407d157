"""A text or chat prompt's `/tokenize` request: the fields that shape the engine's token ids."""

from __future__ import annotations

from ucmctl.proxy.rewrite import CHAT, COMPLETIONS
from ucmctl.proxy.tokenize import tokenize_body


def test_a_text_prompt_is_asked_with_its_special_tokens_setting() -> None:
    assert tokenize_body({"model": "m", "prompt": "hi there", "max_tokens": 3}, COMPLETIONS) == {
        "model": "m",
        "prompt": "hi there",
    }
    body = {"model": "m", "prompt": ["one"], "add_special_tokens": False, "temperature": 0}
    assert tokenize_body(body, COMPLETIONS) == {"model": "m", "prompt": "one", "add_special_tokens": False}


def test_token_ids_and_several_prompts_are_not_asked() -> None:
    assert tokenize_body({"model": "m", "prompt": [1, 2, 3]}, COMPLETIONS) is None
    assert tokenize_body({"model": "m", "prompt": ["a", "b"]}, COMPLETIONS) is None
    assert tokenize_body({"model": "m", "prompt": [[1, 2], [3]]}, COMPLETIONS) is None


def test_a_chat_is_asked_with_what_its_template_reads_and_nothing_else() -> None:
    messages = [{"role": "user", "content": "hello"}]
    body = {
        "model": "m",
        "messages": messages,
        "add_generation_prompt": False,
        "continue_final_message": True,
        "chat_template_kwargs": {"enable_thinking": False},
        "tools": [{"type": "function", "function": {"name": "f"}}],
        "max_tokens": 9,
        "stream": True,
        "user": "u1",
    }
    assert tokenize_body(body, CHAT) == {
        "model": "m",
        "messages": messages,
        "add_generation_prompt": False,
        "continue_final_message": True,
        "chat_template_kwargs": {"enable_thinking": False},
        "tools": [{"type": "function", "function": {"name": "f"}}],
    }
    assert tokenize_body({"messages": messages}, CHAT) == {"messages": messages}  # no model: none sent
