"""Selective disaggregation: which path a pd request takes (state.ProxyState.decode_first)."""

from __future__ import annotations

from ucmctl.proxy.config import make_config
from ucmctl.proxy.kv_index import block_keys
from ucmctl.proxy.rewrite import COMPLETIONS
from ucmctl.proxy.state import SATURATED_LEGS, ProxyState, Request

PROMPT = list(range(1000, 1640))  # 40 blocks of 16


def state(direct_below: int, roles: str = "fixed") -> ProxyState:
    config = make_config(
        host="127.0.0.1", port=7000, mode="pd", routing_name="kv", roles=roles, direct_below=direct_below,
        prefillers=["http://127.0.0.1:8001", "http://127.0.0.1:8002"],
        decoders=["http://127.0.0.1:8101", "http://127.0.0.1:8102"],
    )  # fmt: skip
    return ProxyState.create(config)


def request(prompt: list[int]) -> Request:
    body = {"model": "m", "prompt": prompt}
    return Request(b"", body, COMPLETIONS, len(prompt), {}, blocks=block_keys(body, COMPLETIONS, 16))


def test_few_tokens_to_compute_go_straight_to_decode() -> None:
    s = state(200)
    assert s.decode_first(request([5] * 100))[1] == "direct"  # 100 tokens, nothing cached
    assert s.decode_first(request(PROMPT))[1] is None  # 640 to compute: prefill first
    assert s.index is not None
    decode = s.pool.by_role["decode"][0]
    s.index.took(request(PROMPT).blocks, s.pool.by_role["prefill"][0], saved=True)  # the store has it
    chosen, path = s.decode_first(request([*PROMPT, *range(20)]))
    assert chosen in s.pool.by_role["decode"] and path == "direct"  # 20 to compute after the store's 640
    for d in s.pool.by_role["decode"]:
        d.acquire(100)  # a prompt computing on every decode instance: none takes another
    assert s.decode_first(request([5] * 100))[1] is None
    decode.answered(100)
    assert s.decode_first(request([5] * 100)) == (decode, "direct")


def test_every_prefill_busy_and_a_decode_idle_goes_straight_to_decode() -> None:
    s = state(200)
    prefills, decodes = s.pool.by_role["prefill"], s.pool.by_role["decode"]
    fresh = request(PROMPT)
    for p in prefills:
        for _ in range(SATURATED_LEGS - 1):
            p.acquire(640)
    assert s.decode_first(fresh)[1] is None  # one prefill leg each: not saturated
    prefills[0].acquire(640)
    assert s.decode_first(fresh)[1] is None  # one of them has room still
    prefills[1].acquire(640)
    chosen, path = s.decode_first(fresh)
    assert path == "direct_saturated" and chosen is not None
    for d in decodes:
        d.acquire(640)  # a prompt computing on every decode instance: no room there
    assert s.decode_first(fresh)[1] is None
    prefills[1].answered(640)  # a prefill leg answered: that one has room again
    decodes[0].answered(640)
    assert s.decode_first(fresh)[1] is None


def test_no_direct_path_without_direct_below() -> None:
    s = state(0)
    for p in s.pool.by_role["prefill"]:
        for _ in range(3):
            p.acquire(640)
    assert s.decode_first(request([5] * 100)) == (None, None)


def test_roles_per_request_send_each_request_whole_where_the_policy_puts_its_prompt() -> None:
    config = make_config(
        host="127.0.0.1", port=7000, mode="pd", roles="dynamic",
        prefillers=["http://127.0.0.1:8001", "http://127.0.0.1:8002"],
        decoders=["http://127.0.0.1:8101", "http://127.0.0.1:8102"],
    )  # fmt: skip
    s = ProxyState.create(config)  # least-loaded: prompt tokens in flight
    everyone = s.pool.all()  # two declared prefill, two decode: all four take either leg
    for inst in everyone:
        if inst is not everyone[2]:
            inst.acquire(640)  # a prompt in flight on three of them (computing or answering)
    fresh = request(PROMPT)
    assert s.decode_first(fresh) == (everyone[2], "direct")  # a declared decode instance takes it whole
    everyone[2].acquire(640)
    everyone[2].acquire(640)
    chosen, path = s.decode_first(fresh)
    assert path == "direct" and chosen in (everyone[0], everyone[1], everyone[3]), chosen
    assert state(0).decode_first(fresh) == (None, None)  # fixed roles: a prefill leg, then decode
