"""Assertions on OpenAI-compatible responses, shared by the simulator's and real vLLM's tests."""

from __future__ import annotations

import json
from typing import Any


def parse_sse(raw: bytes) -> list[Any]:
    """SSE body -> decoded JSON events, then the string '[DONE]' if it came."""
    events: list[Any] = []
    for block in raw.decode().split("\n\n"):
        block = block.strip()
        if not block:
            continue
        assert block.startswith("data: "), f"not an SSE data line: {block[:80]!r}"
        payload = block[len("data: ") :]
        events.append(payload if payload == "[DONE]" else json.loads(payload))
    return events


def check_completion(body: dict[str, Any], prompt_tokens: int, max_tokens: int) -> str:
    """A non-streaming /v1/completions answer; returns its text."""
    assert body["object"] == "text_completion"
    assert isinstance(body["id"], str) and body["id"]
    assert isinstance(body["created"], int) and isinstance(body["model"], str)
    (choice,) = body["choices"]
    assert choice["index"] == 0 and isinstance(choice["text"], str)
    assert choice["finish_reason"] == "length"
    usage = body["usage"]
    assert usage["prompt_tokens"] == prompt_tokens
    assert usage["completion_tokens"] == max_tokens
    assert usage["total_tokens"] == prompt_tokens + max_tokens
    return str(choice["text"])


def check_completion_stream(events: list[Any], prompt_tokens: int, max_tokens: int) -> list[str]:
    """A streamed /v1/completions answer with include_usage; returns the text pieces."""
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    ids = {c["id"] for c in chunks}
    assert len(ids) == 1
    with_choices = [c for c in chunks if c["choices"]]
    texts = [c["choices"][0]["text"] for c in with_choices]
    assert all(c["object"] == "text_completion" for c in chunks)
    assert with_choices[-1]["choices"][0]["finish_reason"] == "length"
    assert all(c["choices"][0]["finish_reason"] is None for c in with_choices[:-1])
    usage = chunks[-1]["usage"]
    assert chunks[-1]["choices"] == []
    assert usage["prompt_tokens"] == prompt_tokens and usage["completion_tokens"] == max_tokens
    return texts


def check_chat(body: dict[str, Any], max_tokens: int) -> str:
    assert body["object"] == "chat.completion"
    (choice,) = body["choices"]
    assert choice["message"]["role"] == "assistant" and isinstance(choice["message"]["content"], str)
    assert choice["finish_reason"] == "length"
    assert body["usage"]["completion_tokens"] == max_tokens
    return str(choice["message"]["content"])


def check_chat_stream(events: list[Any], max_tokens: int) -> None:
    assert events[-1] == "[DONE]"
    chunks = [c for c in events[:-1] if c["choices"]]
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert chunks[0]["choices"][0]["delta"].get("role") == "assistant"
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    assert events[-2]["usage"]["completion_tokens"] == max_tokens


def check_error(status: int, body: dict[str, Any]) -> str:
    assert status == 400
    error = body["error"]
    assert isinstance(error["message"], str) and error["message"]
    return str(error["message"])


def metric(text: str, name: str) -> float:
    """Sum of a Prometheus metric over all its label sets."""
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            total += float(line.rsplit(" ", 1)[1])
    return total


def greedy_with_logprobs(url: str, prompt: list[int], model: str = "m") -> tuple[list[int], list[Any]]:
    """8 greedy tokens of `prompt` as ids, with their top-3 logprobs: two servers holding the
    same KV for the prompt answer exactly the same."""
    import urllib.request

    body = {"model": model, "prompt": prompt, "max_tokens": 8, "temperature": 0.0, "logprobs": 3,
            "ignore_eos": True, "return_tokens_as_token_ids": True}  # fmt: skip
    req = urllib.request.Request(f"{url}/v1/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})  # fmt: skip
    with urllib.request.urlopen(req, timeout=300) as r:
        lp = json.loads(r.read())["choices"][0]["logprobs"]
    return [int(t.removeprefix("token_id:")) for t in lp["tokens"]], lp["top_logprobs"]


def counter(url: str, name: str) -> float:
    """A Prometheus counter of a server, summed over its label sets."""
    import urllib.request

    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as r:
        text = r.read().decode()
    return sum(float(x.rsplit(" ", 1)[1]) for x in text.splitlines() if x.startswith(name + "{"))
