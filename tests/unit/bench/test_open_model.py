"""A typed part of a result: named fields typed, other keys kept, the keys' order kept."""

from __future__ import annotations

import json

from ucmctl.bench.open_model import Open, plain


class Inner(Open):
    n: int | float = 0


class Outer(Open):
    a: int = 0
    inner: Inner | None = None
    many: list[Inner] = []  # noqa: RUF012  # pydantic copies it


def test_the_document_keeps_the_order_the_values_and_the_unknown_keys() -> None:
    doc = {"z": {"k": [1, 2]}, "many": [{"x": 1, "n": 2}], "inner": {"n": 1.0, "y": None}, "a": 3}
    typed = Outer.model_validate(doc)
    assert typed.inner is not None and typed.inner.n == 1.0 and isinstance(typed.many[0].n, int)
    assert json.dumps(typed.document()) == json.dumps(doc)
    assert list(Outer.model_validate({"a": 1}).document()) == ["a"]  # no default added


def test_a_model_built_in_code_gives_the_fields_it_was_given() -> None:
    made = Outer(a=2, inner=Inner(n=5))
    assert made.document() == {"a": 2, "inner": {"n": 5}}
    assert plain([made, {"k": Inner(n=1)}]) == [{"a": 2, "inner": {"n": 5}}, {"k": {"n": 1}}]
