"""A request's JSON body parsed once, and its legs' payloads written without writing its long
values again.

A leg's payload is the client's body with a few short fields changed (`max_tokens`, `stream`,
`return_token_ids`, `kv_transfer_params`); its long values (a prompt of token ids or text, a
chat's messages) are the client's. `json.dumps` of a 32k-token prompt costs ~2.5 ms, as much
as parsing it, and the proxy wrote it once a leg. `parse` keeps the text of each long top-level
value as the client sent it (one pass, the same values as `json.loads`); `dumps` writes an
object whose long values are still the very objects parsed with their text as it came (the key
order aside), and every other value as `json.dumps` does.
"""

from __future__ import annotations

import json
import re
from json.decoder import scanstring  # type: ignore[attr-defined]
from typing import Any, NamedTuple

try:  # a long array of ints (a prompt of token ids) read in C (csrc/kv_index.cpp): ~4x json's scanner
    from ucmctl.proxy._kv import int_list as _int_list
except ImportError:  # a source tree not built: json's scanner reads it
    _int_list = None

LONG = 2048  # characters: a value's text kept from this length on (a shorter one is cheap to write)


class Long(NamedTuple):
    """A long top-level value: as parsed, its text as sent, and where it is an array of ints
    read in C, the same ints as 8-byte words (the prompt's block keys are read off them)."""

    value: Any
    text: str
    ids: bytes | None = None


# a top-level key -> its long value
Texts = dict[str, Long]

_DECODER = json.JSONDecoder()
_SPACE = re.compile(r"[ \t\n\r]*")


def _skip(text: str, at: int) -> int:
    """Past the white space at `at`."""
    return _SPACE.match(text, at).end()  # type: ignore[union-attr]  # (it always matches)


def parse(raw: bytes) -> tuple[Any, Texts]:
    """The body's value (as `json.loads(raw)` gives it, and its errors) and the texts of its
    long top-level values. A body this walk does not read as a plain UTF-8 object (another
    encoding, a byte order mark, an array) is parsed by `json.loads` alone: no texts, as a body
    too short to hold a long value."""
    if len(raw) < LONG:
        return json.loads(raw), {}
    try:
        return _walk(raw.decode("utf-8"))
    except ValueError:  # UnicodeDecodeError included: json.loads says what is wrong, or reads it
        return json.loads(raw), {}


def _walk(text: str) -> tuple[dict[str, Any], Texts]:
    """A JSON object's top-level values, each decoded by json's own scanner from where it starts."""
    at = _skip(text, 0)
    if text[at : at + 1] != "{":
        raise ValueError("not an object")
    body: dict[str, Any] = {}
    texts: Texts = {}
    at = _skip(text, at + 1)
    if text[at : at + 1] == "}":
        return _ended(text, at + 1, body, texts)
    while True:
        if text[at : at + 1] != '"':
            raise ValueError("a key expected")
        key, at = scanstring(text, at + 1)
        at = _skip(text, at)
        if text[at : at + 1] != ":":
            raise ValueError("':' expected")
        start = _skip(text, at + 1)
        ints = _int_list(text, start) if _int_list is not None and text.startswith("[", start) else None
        ids = None
        if ints is not None:
            value, end, ids = ints
        else:
            value, end = _DECODER.raw_decode(text, start)
        body[key] = value  # a repeated key: its last value, as json.loads
        if end - start >= LONG:
            texts[key] = Long(value, text[start:end], ids)
        else:
            texts.pop(key, None)
        at = _skip(text, end)
        if text[at : at + 1] == "}":
            return _ended(text, at + 1, body, texts)
        if text[at : at + 1] != ",":
            raise ValueError("',' or '}' expected")
        at = _skip(text, at + 1)


def _ended(text: str, at: int, body: dict[str, Any], texts: Texts) -> tuple[dict[str, Any], Texts]:
    if _skip(text, at) != len(text):
        raise ValueError("extra data")
    return body, texts


def dumps(obj: dict[str, Any], texts: Texts) -> bytes:
    """`obj` as compact JSON (UTF-8), the long values it shares with the parsed body written as
    their text as sent, first."""
    kept = {key: long.text for key, long in texts.items() if key in obj and obj[key] is long.value}
    if not kept:
        return json.dumps(obj, separators=(",", ":")).encode()
    rest = json.dumps({k: v for k, v in obj.items() if k not in kept}, separators=(",", ":"))
    head = ",".join(f"{json.dumps(key)}:{t}" for key, t in kept.items())
    return ("{" + head + ("," + rest[1:] if len(rest) > 2 else "}")).encode()
