"""The proxy's approximate index of where a prompt's blocks are: keys chained over the prefix,
leading counts, an instance that came back holds nothing, and a bound."""

from __future__ import annotations

from ucmctl.proxy.kv_index import KvIndex, block_keys
from ucmctl.proxy.pool import Instance
from ucmctl.proxy.rewrite import CHARS_PER_TOKEN, COMPLETIONS


def body(prompt: object, model: str = "m") -> dict[str, object]:
    return {"model": model, "prompt": prompt}


def test_keys_name_whole_prefixes_of_full_blocks() -> None:
    a = block_keys(body(list(range(40))), COMPLETIONS, 16)
    b = block_keys(body([*range(32), 99, 98]), COMPLETIONS, 16)
    assert len(a) == 2 and len(b) == 2  # full blocks only: 40 tokens are 2 blocks of 16
    assert a == b  # the same 32 leading tokens
    c = block_keys(body([1, *range(1, 40)]), COMPLETIONS, 16)
    assert c[0] != a[0] and c[1] != a[1]  # a different first block changes every key after it
    assert block_keys(body(list(range(40)), "other"), COMPLETIONS, 16) != a  # keys are per model
    text = "x" * (16 * CHARS_PER_TOKEN * 3 + 5)
    assert len(block_keys(body(text), COMPLETIONS, 16)) == 3  # text: an estimate of 4 characters a token


def test_leading_counts_and_what_the_store_has() -> None:
    index, a, b = KvIndex(), Instance("http://a:1", "mixed"), Instance("http://b:1", "mixed")
    keys = block_keys(body(list(range(64))), COMPLETIONS, 16)
    index.took(keys[:3], a, saved=True)
    index.took(keys, b, saved=False)  # loaded into b's own cache: the store gains nothing
    assert (index.held(keys, a), index.held(keys, b), index.stored(keys)) == (3, 4, 3)
    a.epoch += 1  # it came back into routing: it may have restarted
    assert index.held(keys, a) == 0 and index.stored(keys) == 3
    again = Instance("http://b:1", "mixed")  # added again at the same URL: another instance
    assert index.held(keys, again) == 0


def test_the_index_is_bounded() -> None:
    index, a = KvIndex(entries=10), Instance("http://a:1", "mixed")
    for n in range(30):
        index.took(block_keys(body([n] * 32), COMPLETIONS, 16), a, saved=True)
    assert len(index) == 10
    newest = block_keys(body([29] * 32), COMPLETIONS, 16)
    assert index.held(newest, a) == 2 and index.stored(block_keys(body([0] * 32), COMPLETIONS, 16)) == 0
