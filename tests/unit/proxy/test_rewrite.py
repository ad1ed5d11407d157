"""The two legs written from the client's request, and the 400 reasons."""

from __future__ import annotations

import json

import pytest

from ucmctl.proxy.rewrite import (
    CHAT,
    COMPLETIONS,
    BadRequest,
    decode_payload,
    engine_of,
    kv_params_of,
    mooncake_decode_params,
    parse_body,
    prefill_payload,
    prefix_key,
    prompt_tokens,
)


@pytest.mark.parametrize(
    ("raw", "path", "reason"),
    [
        (b"", COMPLETIONS, "no body"),
        (b"{not json", COMPLETIONS, "not valid JSON"),
        (b"[1, 2]", COMPLETIONS, "must be a JSON object, not list"),
        (b'{"model": "m"}', COMPLETIONS, "missing field 'prompt'"),
        (b'{"prompt": 5}', COMPLETIONS, "'prompt' must be"),
        (b'{"prompt": []}', COMPLETIONS, "'prompt' must be"),
        (b'{"prompt": [1, "a"]}', COMPLETIONS, "'prompt' must be"),
        (b'{"prompt": "hi", "max_tokens": 0}', COMPLETIONS, "'max_tokens' must be a positive integer"),
        (b'{"prompt": "hi", "max_tokens": "9"}', COMPLETIONS, "'max_tokens' must be a positive integer"),
        (b'{"prompt": "hi", "stream": "yes"}', COMPLETIONS, "'stream' must be true or false"),
        (b'{"model": "m"}', CHAT, "missing field 'messages'"),
        (b'{"messages": []}', CHAT, "'messages' must be a non-empty list"),
        (
            b'{"messages": [{"role": "user", "content": "x"}], "max_completion_tokens": -1}',
            CHAT,
            "max_completion",
        ),
    ],
)
def test_bad_requests_name_the_reason(raw: bytes, path: str, reason: str) -> None:
    with pytest.raises(BadRequest, match=reason):
        parse_body(raw, path)


def test_valid_prompts() -> None:
    for prompt in ("text", ["a", "b"], [1, 2, 3], [[1, 2], [3]]):
        assert parse_body(json.dumps({"prompt": prompt}).encode(), COMPLETIONS)[0]["prompt"] == prompt


@pytest.mark.parametrize(
    "prompt",
    [[1, True], [1, 2.0], [1, None], [1, "2"], [[1, 2], [3, False]], [[1], []], [1, [2]], [{"a": 1}], []],
)
def test_ids_that_are_not_all_ints_are_refused(prompt: list[object]) -> None:
    with pytest.raises(BadRequest, match="list of token ids"):
        parse_body(json.dumps({"prompt": prompt}).encode(), COMPLETIONS)


@pytest.mark.parametrize("last", [True, 2.5, None, "x"])
def test_a_long_prompt_of_ids_is_checked_to_its_last(last: object) -> None:
    with pytest.raises(BadRequest, match="list of token ids"):
        parse_body(json.dumps({"prompt": [7] * 5000 + [last]}).encode(), COMPLETIONS)


def test_prompt_tokens_exact_for_ids_estimated_for_text() -> None:
    assert prompt_tokens({"prompt": list(range(300))}, COMPLETIONS) == 300
    assert prompt_tokens({"prompt": [[1, 2], [3]]}, COMPLETIONS) == 3
    assert prompt_tokens({"prompt": "x" * 400}, COMPLETIONS) == 101
    chat = {
        "messages": [
            {"role": "system", "content": "a" * 100},
            {"role": "user", "content": [{"text": "b" * 99}]},
        ]
    }
    assert prompt_tokens(chat, CHAT) == 51  # 200 characters with the joining newline


def test_prefix_key_depends_on_the_leading_block_only() -> None:
    shared = list(range(128))
    a = prefix_key({"prompt": [*shared, 1, 2]}, COMPLETIONS, 128)
    b = prefix_key({"prompt": [*shared, 9]}, COMPLETIONS, 128)
    c = prefix_key({"prompt": [0, *shared]}, COMPLETIONS, 128)
    assert a == b != c
    assert prefix_key({"prompt": "s" * 600}, COMPLETIONS, 128) == prefix_key(
        {"prompt": "s" * 512 + "t"}, COMPLETIONS, 128
    )
    assert prefix_key({"model": "x", "prompt": "p"}, COMPLETIONS, 8) != prefix_key(
        {"model": "y", "prompt": "p"}, COMPLETIONS, 8
    )


def test_prefill_leg_is_one_token_not_streamed() -> None:
    body = {
        "model": "m", "prompt": [1, 2], "max_tokens": 256, "max_completion_tokens": 256, "stream": True,
        "stream_options": {"include_usage": True}, "min_tokens": 5, "temperature": 0.5,
        "return_token_ids": True,
    }  # fmt: skip
    leg = json.loads(prefill_payload(body, p2p=None))
    assert leg == {
        "model": "m",
        "prompt": [1, 2],
        "max_tokens": 1,
        "max_completion_tokens": 1,
        "temperature": 0.5,
    }
    assert body["max_tokens"] == 256 and body["stream"] is True  # the client's request is not touched


def test_prefill_leg_sets_max_tokens_even_when_absent() -> None:
    leg = json.loads(prefill_payload({"messages": [{"role": "user", "content": "x"}]}, p2p=None))
    assert leg["max_tokens"] == 1 and "max_completion_tokens" not in leg


def test_prefill_leg_asks_for_remote_decode_only_in_p2p() -> None:
    # vllm-ascend 0.23's load_balance_proxy_server_example.py, field for field
    leg = json.loads(prefill_payload({"prompt": "x", "stream": True}, p2p="ascend"))
    assert leg == {
        "prompt": "x",
        "max_tokens": 1,
        "min_tokens": 1,
        "kv_transfer_params": {
            "do_remote_decode": True,
            "do_remote_prefill": False,
            "remote_engine_id": None,
            "remote_block_ids": None,
            "remote_host": None,
            "remote_port": None,
        },
    }
    # vLLM 0.32's MooncakeConnector: the router's transfer_id is what the prefiller waits on
    leg = json.loads(prefill_payload({"prompt": "x"}, p2p="mooncake", transfer_id="xfer-1"))
    assert leg["kv_transfer_params"] == {"do_remote_decode": True, "transfer_id": "xfer-1"}
    assert leg["min_tokens"] == 1 and leg["max_tokens"] == 1
    with pytest.raises(ValueError, match="transfer_id"):
        prefill_payload({"prompt": "x"}, p2p="mooncake")
    assert "kv_transfer_params" not in json.loads(
        prefill_payload({"prompt": "x", "kv_transfer_params": {}}, p2p=None)
    )


def test_decode_leg_is_the_clients_bytes_unless_kv_params_ride_along() -> None:
    raw = b'{"prompt": "x",   "stream": true}'
    body = json.loads(raw)
    assert decode_payload(raw, body, None) is raw  # no re-serialisation on the common path
    params = {"do_remote_prefill": True, "remote_block_ids": [1, 2], "remote_host": "h", "remote_port": 5}
    leg = json.loads(decode_payload(raw, body, params))
    assert leg == {"prompt": "x", "stream": True, "kv_transfer_params": params}


def test_kv_params_of_prefill_answer() -> None:
    assert kv_params_of(b'{"id": "1", "kv_transfer_params": {"remote_port": 5}}') == {"remote_port": 5}
    assert kv_params_of(b'{"id": "1", "kv_transfer_params": null}') is None
    assert kv_params_of(b'{"id": "1", "kv_transfer_params": {}}') is None
    assert kv_params_of(b"not json") is None
    assert kv_params_of(b"[]") is None


def test_mooncake_decode_params_name_the_transfer_and_the_engine() -> None:
    params = mooncake_decode_params("xfer-1", "eng-a", "http://10.0.0.1:8998")
    assert params == {
        "do_remote_prefill": True,
        "do_remote_decode": False,
        "transfer_id": "xfer-1",
        "remote_engine_id": "eng-a",
        "remote_bootstrap_addr": "http://10.0.0.1:8998",
    }


def test_engine_of_a_bootstrap_answer() -> None:
    one = b'{"0": {"engine_id": "eng-a", "worker_addr": {"0": {"0": "tcp://h:1"}}}}'
    assert engine_of(one) == "eng-a"
    for bad, why in (
        (b"{}", "no engine has registered"),
        (b'{"0": {"engine_id": "a"}, "1": {"engine_id": "b"}}', "2 DP ranks behind one API server"),
        (b'{"0": {"worker_addr": {}}}', "names no engine_id"),
    ):
        with pytest.raises(ValueError, match=why):
            engine_of(bad)
