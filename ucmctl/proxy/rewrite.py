"""Reading a client's request and writing the two legs of it (pure functions, no I/O)."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from ucmctl.proxy import jsontext

COMPLETIONS = "/v1/completions"
CHAT = "/v1/chat/completions"
CHARS_PER_TOKEN = 4  # a cheap estimate of text prompts' length; token-id prompts are counted exactly

# what vllm-ascend's MooncakeConnectorV1 expects on the prefill leg; the prefiller fills in the rest
ASCEND_PREFILL_PARAMS: dict[str, Any] = {
    "do_remote_decode": True,
    "do_remote_prefill": False,
    "remote_engine_id": None,
    "remote_block_ids": None,
    "remote_host": None,
    "remote_port": None,
}


class BadRequest(Exception):
    """The client's request cannot be served as sent; the message is the reason given back."""


def parse_body(raw: bytes, path: str) -> tuple[dict[str, Any], jsontext.Texts]:
    """The request's JSON object, checked for what the proxy needs, and the text of its long
    values as sent (the legs' payloads reuse it); or BadRequest with the reason."""
    if not raw:
        raise BadRequest("the request has no body; send a JSON object")
    try:
        body, texts = jsontext.parse(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise BadRequest(f"the body is not valid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise BadRequest(f"the body must be a JSON object, not {type(body).__name__}")
    if path == CHAT:
        messages = body.get("messages")
        if messages is None:
            raise BadRequest("missing field 'messages'")
        if not isinstance(messages, list) or not messages or not all(isinstance(m, dict) for m in messages):
            raise BadRequest("'messages' must be a non-empty list of objects")
    else:
        if "prompt" not in body:
            raise BadRequest("missing field 'prompt'")
        if not _valid_prompt(body["prompt"]):
            raise BadRequest("'prompt' must be a string, a list of strings, or a list of token ids")
    for name in ("max_tokens", "max_completion_tokens"):
        value = body.get(name)
        if value is not None and (type(value) is not int or value < 1):
            raise BadRequest(f"'{name}' must be a positive integer")
    if "stream" in body and not isinstance(body["stream"], bool):
        raise BadRequest("'stream' must be true or false")
    return body, texts


try:  # one C type check an id (csrc/kv_index.cpp): a 32k-token prompt checked in tens of us, not ~1.3 ms
    from ucmctl.proxy._kv import all_ints as _all_ints
except ImportError:  # a source tree not built

    def _all_ints(prompt: list[Any]) -> bool:
        return all(type(t) is int for t in prompt)


def _valid_prompt(prompt: Any) -> bool:
    if isinstance(prompt, str):
        return True
    if not isinstance(prompt, list) or not prompt:
        return False
    first = prompt[0]
    if isinstance(first, str):
        return all(isinstance(p, str) for p in prompt)
    if isinstance(first, list):
        return all(isinstance(p, list) and p and _all_ints(p) for p in prompt)
    return _all_ints(prompt)


def prompt_of(body: dict[str, Any], path: str) -> str | list[int]:
    """The prompt as one string, or its token ids; what load and affinity are computed on."""
    if path != CHAT:
        prompt = body["prompt"]
        if isinstance(prompt, str):
            return prompt
        if isinstance(prompt[0], str):
            return "".join(prompt)
        if isinstance(prompt[0], list):
            return [t for p in prompt for t in p]
        return prompt  # type: ignore[no-any-return]
    parts: list[str] = []
    for m in body["messages"]:
        content = m.get("content")
        if isinstance(content, str):
            parts.append(content)
        elif isinstance(content, list):
            parts.extend(p.get("text", "") for p in content if isinstance(p, dict))
    return "\n".join(parts)


def prompt_tokens(body: dict[str, Any], path: str) -> int:
    """The prompt's length in tokens: exact for token ids, estimated for text."""
    prompt = prompt_of(body, path)
    if isinstance(prompt, str):
        return len(prompt) // CHARS_PER_TOKEN + 1
    return len(prompt)


def prefix_key(body: dict[str, Any], path: str, tokens: int) -> bytes:
    """A digest of the prompt's leading block of `tokens` tokens (and the model): the affinity key."""
    prompt = prompt_of(body, path)
    if isinstance(prompt, str):
        head = prompt[: tokens * CHARS_PER_TOKEN].encode()
    else:
        head = b",".join(b"%d" % t for t in prompt[:tokens])
    model = str(body.get("model", "")).encode()
    return hashlib.blake2b(model + b"\0" + head, digest_size=16).digest()


def prefill_payload(
    body: dict[str, Any],
    texts: jsontext.Texts | None = None,
    *,
    p2p: str | None,
    transfer_id: str | None = None,
) -> bytes:
    """The prefill leg: the client's request cut to one token, not streamed, with P2P params if asked.

    `p2p` is the router protocol: "mooncake" (vLLM's MooncakeConnector: the request's
    `transfer_id`), "ascend" (vllm-ascend's MooncakeConnectorV1) or None.
    """
    leg = dict(body)
    leg["max_tokens"] = 1
    if "max_completion_tokens" in leg:
        leg["max_completion_tokens"] = 1
    # (token ids: the prefill's one token is never the client's, its prompt's ids are not needed)
    for name in ("stream", "stream_options", "min_tokens", "return_token_ids"):
        leg.pop(name, None)
    if p2p:
        # Both Mooncake connectors hand KV over only for a request that stopped at its length
        # (an end-of-sequence token as the one token would keep it): vllm-ascend's proxy asks
        # for min_tokens 1 for this reason.
        leg["min_tokens"] = 1
    if p2p == "mooncake":
        if not transfer_id:
            raise ValueError("the mooncake protocol needs a transfer_id")
        leg["kv_transfer_params"] = {"do_remote_decode": True, "transfer_id": transfer_id}
    elif p2p == "ascend":
        leg["kv_transfer_params"] = dict(ASCEND_PREFILL_PARAMS)
    else:
        leg.pop("kv_transfer_params", None)
    return jsontext.dumps(leg, texts or {})


def kv_params_of(prefill_response: bytes) -> dict[str, Any] | None:
    """The `kv_transfer_params` a prefiller returned, or None when it returned none."""
    try:
        data = json.loads(prefill_response)
    except (ValueError, UnicodeDecodeError):
        return None
    params = data.get("kv_transfer_params") if isinstance(data, dict) else None
    return params if isinstance(params, dict) and params else None


def mooncake_decode_params(transfer_id: str, engine_id: str, bootstrap: str) -> dict[str, Any]:
    """The decode leg's params for vLLM's MooncakeConnector: pull this transfer from that engine."""
    return {
        "do_remote_prefill": True,
        "do_remote_decode": False,
        "transfer_id": transfer_id,
        "remote_engine_id": engine_id,
        "remote_bootstrap_addr": bootstrap,
    }


def engine_of(query_answer: bytes) -> str:
    """The engine id a prefiller's Mooncake bootstrap server lists (`GET /query`).

    ValueError when the answer is not one engine: an API server that runs several DP ranks
    cannot say which rank served a request.
    """
    data = json.loads(query_answer)
    if not isinstance(data, dict) or not data:
        raise ValueError("no engine has registered yet")
    if len(data) > 1:
        raise ValueError(f"{len(data)} DP ranks behind one API server (use one API server per rank)")
    (entry,) = data.values()
    engine = entry.get("engine_id") if isinstance(entry, dict) else None
    if not isinstance(engine, str) or not engine:
        raise ValueError("the answer names no engine_id")
    return engine


def decode_payload(
    raw: bytes, body: dict[str, Any], kv_params: dict[str, Any] | None, texts: jsontext.Texts | None = None
) -> bytes:
    """The decode leg: the client's bytes untouched, unless the prefiller's KV params must ride along."""
    if kv_params is None:
        return raw
    return jsontext.dumps({**body, "kv_transfer_params": kv_params}, texts or {})
