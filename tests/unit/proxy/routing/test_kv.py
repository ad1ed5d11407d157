"""`kv`: least expected time to first token from where the prompt's KV is."""

from __future__ import annotations

from tests.unit.proxy.routing.helpers import pool_of
from ucmctl.proxy.kv_index import block_keys
from ucmctl.proxy.pool import Instance, Pool
from ucmctl.proxy.rewrite import COMPLETIONS
from ucmctl.proxy.routing import Ask
from ucmctl.proxy.routing.kv import PRIOR_PREFILL_S, Kv

BS = 16


def ask(role: str, prompt: list[int]) -> Ask:
    load = "tokens" if role != "decode" else "requests"
    keys = block_keys({"model": "m", "prompt": prompt}, COMPLETIONS, BS)
    return Ask(role, load, len(prompt), blocks=keys)  # type: ignore[arg-type]


def route(kv: Kv, pool: Pool, a: Ask, seconds: float = 0.1) -> Instance:
    """As the request path does: the policy chooses, learns of the leg, the index takes it."""
    inst = kv.choose(pool.candidates(a.role), a)
    kv.done(inst, a, seconds)
    kv.index.took(a.blocks, inst, saved=a.role != "decode")
    return inst


def test_a_prompt_goes_back_to_the_instance_that_holds_it() -> None:
    kv, pool = Kv(BS), pool_of("mixed", 3)
    prompt = list(range(1000, 1640))  # 40 blocks
    home = route(kv, pool, ask("mixed", prompt))
    assert all(route(kv, pool, ask("mixed", [*prompt, n])) is home for n in range(5))


def test_a_busy_holder_loses_to_an_idle_instance_that_loads_from_the_store() -> None:
    kv, pool = Kv(BS), pool_of("mixed", 2)
    prompt = list(range(2000, 2640))
    home = route(kv, pool, ask("mixed", prompt))
    other = next(i for i in pool.by_role["mixed"] if i is not home)
    home.acquire(4000)  # 4,000 prompt tokens queued there: computing them costs more than a load
    assert route(kv, pool, ask("mixed", prompt)) is other
    home.release(4000)
    # both hold it now (the other loaded it): by load again
    assert kv.index.held(ask("mixed", prompt).blocks, other) == 40


def test_a_holder_busy_answering_keeps_its_prefix() -> None:
    kv, pool = Kv(BS), pool_of("mixed", 2)
    prompt = list(range(4000, 4640))
    home = route(kv, pool, ask("mixed", prompt))
    for _ in range(6):
        home.acquire(2000)
        home.answered(2000)  # six long streams answering there: decode work, no prefill queued
    assert route(kv, pool, ask("mixed", [*prompt, 1])) is home


def test_fresh_prompts_go_by_load() -> None:
    kv, pool = Kv(BS), pool_of("prefill", 3)
    a, b, c = pool.by_role["prefill"]
    a.acquire(500)
    b.acquire(100)
    assert kv.choose(pool.candidates("prefill"), ask("prefill", list(range(320)))) is c


def test_decode_prefers_the_holder_within_the_bound() -> None:
    kv, pool = Kv(BS), pool_of("decode", 2)
    prompt = list(range(3000, 3320))
    home = route(kv, pool, ask("decode", prompt))
    other = next(i for i in pool.by_role["decode"] if i is not home)
    home.acquire(1)  # one stream more than the other: within 1.25x the average
    assert route(kv, pool, ask("decode", [*prompt, 1])) is home
    for _ in range(3):
        home.acquire(1)  # 4 streams to 0: past the bound
    assert route(kv, pool, ask("decode", [*prompt, 2])) is other


def test_the_speeds_are_measured_from_the_legs() -> None:
    kv, pool = Kv(BS), pool_of("prefill", 1)
    described = kv.describe()
    assert described["prefill"] == {"seconds_per_token": PRIOR_PREFILL_S, "measured": False, "samples": 0}
    route(kv, pool, ask("prefill", list(range(640))), seconds=0.64)  # 640 tokens computed in 0.64 s
    got = kv.describe()["prefill"]
    assert got["measured"] is True and got["samples"] == 1  # type: ignore[index]
    assert abs(got["seconds_per_token"] - 1e-3) < 1e-12  # type: ignore[index]
    # the same prompt again on an instance that lost its cache: a load from the store
    (inst,) = pool.by_role["prefill"]
    inst.epoch += 1
    route(kv, pool, ask("prefill", list(range(640))), seconds=0.064)
    load = kv.describe()["load"]
    assert load["measured"] is True and abs(load["seconds_per_token"] - 1e-4) < 1e-12  # type: ignore[index]
    assert kv.describe()["index"] == "approximate (the proxy's routing history)"


def test_the_policy_reads_the_proxys_index_even_empty() -> None:
    from ucmctl.proxy.kv_index import KvIndex
    from ucmctl.proxy.routing import make_policy

    index = KvIndex()  # empty, so falsy: still the one the policy must read
    policy = make_policy("kv", 16, index)
    assert isinstance(policy, Kv) and policy.index is index and policy.block_size == 16


def test_it_sums_what_it_expected_each_instance_to_take_from_its_cache_and_the_store() -> None:
    """The expected local hits are vLLM's: whole blocks, at most the blocks before the prompt's
    last token (vLLM computes it); the rest of what the store holds is an external hit."""
    kv, pool = Kv(BS), pool_of("mixed", 2)
    prompt = list(range(5000, 5640))  # exactly 40 blocks
    home = route(kv, pool, ask("mixed", prompt))
    route(kv, pool, ask("mixed", prompt))  # all 40 held: vLLM hits 39 (it computes the last token)
    route(kv, pool, ask("mixed", [*prompt, *range(20)]))  # 41 blocks, 40 held
    other = next(i for i in pool.by_role["mixed"] if i is not home)
    home.acquire(20_000)  # too busy: the other loads the 40 blocks from the store
    assert route(kv, pool, ask("mixed", [*prompt, 7])) is other
    p = kv.describe()["predicted"]
    assert p == {  # type: ignore[comparison-overlap]
        home.url: {"legs": 3, "prompt": 640 + 640 + 660, "local": 0 + 39 * BS + 40 * BS, "external": 0},
        other.url: {"legs": 1, "prompt": 641, "local": 0, "external": 40 * BS},
    }
    # a decode leg computes no prompt (pd): not counted
    dec = pool_of("decode", 1)
    route(kv, dec, ask("decode", prompt))
    assert set(kv.describe()["predicted"]) == {home.url, other.url}  # type: ignore[arg-type]


def test_without_the_store_term_a_load_counts_as_a_recompute() -> None:
    """The ablation of benchmarks/routing.py: a holder with 300 tokens queued keeps its prefix
    against an idle instance that would load 640 tokens from the store (0.1x a computed one),
    and loses it with the store counted."""
    for store, expected_home in ((True, False), (False, True)):
        kv, pool = Kv(BS, store=store), pool_of("mixed", 2)
        prompt = list(range(6000, 6640))
        home = route(kv, pool, ask("mixed", prompt))
        home.acquire(300)
        assert (route(kv, pool, ask("mixed", [*prompt, 1])) is home) is expected_home, store
    assert kv.describe()["policy"] == "kv (without the store term)"
