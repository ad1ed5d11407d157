"""The request body parsed once and the legs' payloads written with its long values' text as
sent: for any JSON object (any spacing, escapes and unicode, keys repeated) `parse` gives what
`json.loads` gives, and what `dumps` writes reads back as the object it was given, with each
long value it shares with the body written as the client wrote it."""

from __future__ import annotations

import array
import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ucmctl.proxy import jsontext

SCALARS = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text()
VALUES = st.recursive(SCALARS, lambda x: st.lists(x) | st.dictionaries(st.text(), x), max_leaves=9)

IDS = st.lists(st.integers(0, 200_000), min_size=500, max_size=900)
# a long list of ints that is not only ints of 8 bytes (read by json's scanner, not the C reader)
ODD_IDS = st.tuples(IDS, st.integers(0, 899), SCALARS | st.integers(-(2**70), 2**70)).map(
    lambda t: [*t[0][: t[1]], t[2], *t[0][t[1] :]]
)
ANY_IDS = st.lists(st.integers(), min_size=500, max_size=900)
LONG = IDS | ODD_IDS | ANY_IDS | st.text(min_size=2100, max_size=2500)
BODIES = st.dictionaries(st.text(max_size=8), VALUES | LONG, max_size=6)
SPACING = st.sampled_from([(",", ":"), (", ", ": "), (" ,\n", " :\t")])


def _raw(body: dict[str, Any], seps: tuple[str, str], ascii_only: bool, indent: int | None) -> bytes:
    return json.dumps(body, separators=seps, ensure_ascii=ascii_only, indent=indent).encode()


@settings(max_examples=200, deadline=None)
@given(body=BODIES, seps=SPACING, ascii_only=st.booleans(), indent=st.none() | st.integers(0, 2),
       changes=st.dictionaries(st.text(max_size=8), VALUES, max_size=3), drop=st.booleans())  # fmt: skip
def test_parsed_as_json_loads_and_written_back_faithfully(
    body: dict[str, Any], seps: tuple[str, str], ascii_only: bool, indent: int | None,
    changes: dict[str, Any], drop: bool,
) -> None:  # fmt: skip
    raw = b" \n" + _raw(body, seps, ascii_only, indent) + b"\n"
    parsed, texts = jsontext.parse(raw)
    assert parsed == json.loads(raw)
    for key, (value, text, ids) in texts.items():
        assert value is parsed[key] and json.loads(text) == value and len(text) >= jsontext.LONG
        if ids is not None:  # an array of ints read in C: the same ints as 8-byte words
            assert list(array.array("q", ids)) == value and all(type(v) is int for v in value)
    if indent is None:  # each value's text as json.dumps writes it alone: the long ones are kept
        alone = {k: json.dumps(v, separators=seps, ensure_ascii=ascii_only) for k, v in body.items()}
        assert set(texts) == {k for k, text in alone.items() if len(text) >= jsontext.LONG}
    leg = {**parsed, **changes}
    if drop and parsed:
        leg.pop(next(iter(parsed)))
    out = jsontext.dumps(leg, texts)
    assert json.loads(out) == leg
    for key, (value, text, _) in texts.items():
        if key in leg and leg[key] is value:
            assert text.encode() in out  # the client's own text, not written again


def test_repeated_keys_take_the_last_value_and_its_text() -> None:
    long = list(range(1000))
    raw = json.dumps({"a": 1}).encode()[:-1] + b',"prompt":' + json.dumps(long).encode()
    raw += b',"prompt":[1,2],"x":' + json.dumps(long).encode()
    raw += b',"x":' + json.dumps(long[:900]).encode() + b"}"
    parsed, texts = jsontext.parse(raw)
    assert parsed == json.loads(raw) and parsed["prompt"] == [1, 2] and parsed["x"] == long[:900]
    assert set(texts) == {"x"} and texts["x"].text == json.dumps(long[:900])
    assert list(array.array("q", texts["x"].ids or b"")) == long[:900]
    nan, texts = jsontext.parse(PAD + b',"a":NaN}')  # what json.loads takes, this takes
    assert nan["a"] != nan["a"] and set(texts) == {"p"}


PAD = b'{"p":"' + b"x" * 3000 + b'"'  # long enough to be walked, not left to json.loads


@pytest.mark.parametrize(
    "raw",
    [PAD, PAD + b",}", PAD + b',"a" 1}', PAD + b"} x", PAD + b',"a":[1,2}', PAD + b",'a':1}",
     PAD + b',"\x01":1}', PAD + b',"a":"\x01"}', b"\xff" + PAD + b"}", PAD[:9] + b"\xff" + PAD[9:] + b"}",
     b"{", b"",
     # long lists of ints that are not JSON: what the C reader gives back to json's scanner
     *(b'{"p":[' + b"1," * 2000 + end for end in (b"]}", b"01]}", b"-]}", b"1 2]}", b"1", b"1.]}", b"1]")),
     ],
)  # fmt: skip
def test_what_is_not_json_fails_as_json_loads_fails(raw: bytes) -> None:
    with pytest.raises(ValueError) as expected:
        json.loads(raw)
    with pytest.raises(ValueError) as got:
        jsontext.parse(raw)
    assert str(got.value) == str(expected.value)


@pytest.mark.parametrize(
    "raw",
    [b"[" + b"1," * 2000 + b"2]", b"\xef\xbb\xbf" + PAD + b"}", b"7",
     (PAD + b',"a":"\xc3\xa9"}').decode().encode("utf-16")],
)  # fmt: skip
def test_other_json_reads_as_json_loads_reads_it(raw: bytes) -> None:
    value, texts = jsontext.parse(raw)
    assert repr(value) == repr(json.loads(raw)) and texts == {}
