"""The proxy's approximate index of where a prompt's blocks are: keys chained over the prefix,
leading counts, an instance that came back holds nothing, and a bound."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from ucmctl.proxy import kv_index
from ucmctl.proxy.kv_index import KvIndex, NativeKvIndex, block_keys
from ucmctl.proxy.pool import Instance
from ucmctl.proxy.rewrite import CHARS_PER_TOKEN, COMPLETIONS

BUILT = kv_index._native is not None
# the index in Python (the reference) and in C (csrc/kv_index.cpp, where it is built)
INDEXES = [KvIndex, pytest.param(NativeKvIndex, marks=pytest.mark.skipif(not BUILT, reason="not built"))]
# the keys in C where built, and the numpy code that stands in where not
KEYS_IN = ["c", "numpy"] if BUILT else ["numpy"]


@pytest.fixture(params=KEYS_IN)
def keys_in(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    if request.param == "numpy":
        monkeypatch.setattr(kv_index, "_native", None)
    return str(request.param)


def body(prompt: object, model: str = "m") -> dict[str, object]:
    return {"model": model, "prompt": prompt}


def test_keys_name_whole_prefixes_of_full_blocks(keys_in: str) -> None:
    a = block_keys(body(list(range(40))), COMPLETIONS, 16)
    b = block_keys(body([*range(32), 99, 98]), COMPLETIONS, 16)
    assert len(a) == 2 and len(b) == 2  # full blocks only: 40 tokens are 2 blocks of 16
    assert a == b  # the same 32 leading tokens
    c = block_keys(body([1, *range(1, 40)]), COMPLETIONS, 16)
    assert c[0] != a[0] and c[1] != a[1]  # a different first block changes every key after it
    assert block_keys(body(list(range(40)), "other"), COMPLETIONS, 16) != a  # keys are per model
    text = "x" * (16 * CHARS_PER_TOKEN * 3 + 5)
    assert len(block_keys(body(text), COMPLETIONS, 16)) == 3  # text: an estimate of 4 characters a token


M64 = (1 << 64) - 1


def _chained(units: list[int], per_block: int, model: str) -> list[int]:
    """The keys as the chain defines them, one block after another in Python integers."""
    from ucmctl.proxy import kv_index as k

    def mix(x: int) -> int:
        x ^= x >> 30
        x = (x * 0xBF58476D1CE4E5B9) & M64
        x ^= x >> 27
        x = (x * 0x94D049BB133111EB) & M64
        return x ^ (x >> 31)

    def unit(x: int) -> int:
        y = (x * 0xBF58476D1CE4E5B9) & M64
        return y ^ (y >> 31)

    p, keys = k.seed(model), []
    for start in range(0, len(units) - per_block + 1, per_block):
        block = units[start : start + per_block]
        b = sum(unit(u & M64) * pow(k._R, j, 1 << 64) for j, u in enumerate(block))
        p = (p * pow(k._R, per_block, 1 << 64) + b) & M64
        keys.append(mix(p))
    return keys


def test_the_whole_prompt_at_once_gives_the_chain_block_by_block(keys_in: str) -> None:
    """The vectorized keys equal the chain's definition, computed one block at a time: token ids
    (negative and large ones too) and text, prompts of 0 to 70 blocks, every model apart."""
    import random

    rng = random.Random(3)
    for n in (1, 15, 16, 17, 33, 16 * 70 + 5):  # (an empty prompt is refused before: parse_body)
        odd = [-rng.randrange(1, 9), 2**63 - 1 - rng.randrange(9)]
        ids = [rng.choice([rng.randrange(50_000), rng.randrange(50_000), *odd]) for _ in range(n)]
        assert list(block_keys(body(ids, "m1"), COMPLETIONS, 16)) == _chained(ids, 16, "m1")
        text = "".join(rng.choice("abé漢 ") for _ in range(n * 2))
        raw = text.encode()
        words = [int.from_bytes(raw[i : i + 8], "little") for i in range(0, len(raw) - 7, 8)]
        by_words = block_keys(body(text, "m2"), COMPLETIONS, 16)
        by_bytes = block_keys(body(text, "m2"), COMPLETIONS, 5)
        assert list(by_words) == _chained(words, 16 * CHARS_PER_TOKEN // 8, "m2")
        assert list(by_bytes) == _chained(list(raw), 5 * CHARS_PER_TOKEN, "m2")
    # not ids a model has: no blocks, even where they come after the last whole block
    for bad in ([2**63], [1.5], [1, 2, 2**64], [1, 2, 3.0], [1, 2, -(2**63) - 1], [1, 2, "3"]):
        assert block_keys(body(bad), COMPLETIONS, 2) == (), bad
    assert list(block_keys(body([1, 2, True, 4]), COMPLETIONS, 2)) == _chained([1, 2, 1, 4], 2, "m")


@pytest.mark.skipif(not BUILT, reason="not built")
def test_keys_read_off_the_ids_the_parse_packed_are_the_chain() -> None:
    """A long prompt of ids parsed as the proxy parses it: its keys come from the ids packed by
    the parse (no int object read), equal to the chain's; a prompt that is no longer the one
    parsed (replaced in the body) gets its own keys, not the parsed one's."""
    import json
    import random

    from ucmctl.proxy import rewrite

    rng = random.Random(5)
    for n in (600, 16 * 70 + 5, 4097):
        ids = [rng.choice([rng.randrange(150_000), -rng.randrange(1, 9), 10**17 + rng.randrange(9)])
               for _ in range(n)]  # fmt: skip
        raw = json.dumps({"model": "m1", "prompt": ids, "max_tokens": 3}).encode()
        parsed, texts = rewrite.parse_body(raw, COMPLETIONS)
        assert texts["prompt"].ids is not None and len(texts["prompt"].ids) == 8 * n
        keys = block_keys(parsed, COMPLETIONS, 16, texts)
        assert type(keys) is kv_index._native.Keys and list(keys) == _chained(ids, 16, "m1")
        other = {**parsed, "prompt": [7, *ids[1:]]}
        assert list(block_keys(other, COMPLETIONS, 16, texts)) == _chained([7, *ids[1:]], 16, "m1")


@pytest.mark.parametrize("make", INDEXES)
def test_leading_counts_and_what_the_store_has(make: Callable[..., KvIndex]) -> None:
    index, a, b = make(), Instance("http://a:1", "mixed"), Instance("http://b:1", "mixed")
    keys = block_keys(body(list(range(64))), COMPLETIONS, 16)
    index.took(keys[:3], a, saved=True)
    index.took(keys, b, saved=False)  # loaded into b's own cache: the store gains nothing
    assert (index.held(keys, a), index.held(keys, b), index.stored(keys)) == (3, 4, 3)
    a.epoch += 1  # it came back into routing: it may have restarted
    assert index.held(keys, a) == 0 and index.stored(keys) == 3
    again = Instance("http://b:1", "mixed")  # added again at the same URL: another instance
    assert index.held(keys, again) == 0


@pytest.mark.parametrize("make", INDEXES)
def test_the_index_is_bounded(make: Callable[..., KvIndex]) -> None:
    index, a = make(entries=10), Instance("http://a:1", "mixed")
    for n in range(30):
        index.took(block_keys(body([n] * 32), COMPLETIONS, 16), a, saved=True)
    assert len(index) == 10
    newest = block_keys(body([29] * 32), COMPLETIONS, 16)
    assert index.held(newest, a) == 2 and index.stored(block_keys(body([0] * 32), COMPLETIONS, 16)) == 0


@pytest.mark.parametrize("make", INDEXES)
def test_the_bound_takes_a_prompts_tail_before_its_head(make: Callable[..., KvIndex]) -> None:
    """What stays of a prompt the bound cut is a prefix (a walk finds it), not its tail (which no
    walk reaches once its first block is gone)."""
    index, a, b = make(entries=6), Instance("http://a:1", "mixed"), Instance("http://b:1", "mixed")
    first = block_keys(body(list(range(64))), COMPLETIONS, 16)  # 4 blocks
    index.took(first, a, saved=True)
    index.took(block_keys(body(list(range(100, 164))), COMPLETIONS, 16), b, saved=True)  # 4 more
    assert len(index) == 6 and index.held(first, a) == 2 and index.stored(first) == 2


def _walk(index: KvIndex, keys: list[int], has: object) -> int:
    """Leading blocks whose entry satisfies `has`, walked alone."""
    n = 0
    while n < len(keys) and has(index._blocks.get(keys[n], (frozenset(), False))):  # type: ignore[operator]
        n += 1
    return n


def test_one_walk_for_every_candidate_counts_as_one_walk_each() -> None:
    """`leading` (one walk over the prompt's keys for all candidates) gives each the count its
    own walk gives, on prefixes that end at every block, stored or not."""
    import random

    rng = random.Random(7)
    insts = [Instance(f"http://h{i}:1", "mixed") for i in range(4)]
    keys = list(block_keys(body(list(range(16 * 12))), COMPLETIONS, 16))
    for _ in range(200):
        index = KvIndex()
        for inst in insts:
            index.took(keys[: rng.randrange(len(keys) + 1)], inst, saved=rng.random() < 0.5)
        if rng.random() < 0.3:
            insts[rng.randrange(4)].epoch += 1  # back in routing: holds nothing
        asked = keys[: rng.randrange(len(keys) + 1)]
        alone = [_walk(index, asked, lambda e, me=(i.uid, i.epoch): me in e[0]) for i in insts]
        stored = _walk(index, asked, lambda e: e[1])
        assert index.leading(asked, insts) == (alone, stored)
        assert index.stored(asked) == stored and [index.held(asked, i) for i in insts] == alone
