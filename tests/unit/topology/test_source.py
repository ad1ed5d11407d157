from __future__ import annotations

import pytest

from ucmctl.core.errors import UcmctlError
from ucmctl.topology.source import dotted, parse_yaml


def test_lines_are_kept_for_nested_keys_and_list_items() -> None:
    src = parse_yaml("a:\n  b:\n    - x\n    - y\n  c: 1\n")
    assert src.data == {"a": {"b": ["x", "y"], "c": 1}}
    assert src.lines[("a", "b")] == 2
    assert src.lines[("a", "b", 1)] == 4
    assert src.lines[("a", "c")] == 5
    assert src.line_of(("a", "missing", "deeper")) == 1  # falls back to the nearest parent


def test_merge_keys_take_the_anchor_and_explicit_keys_win() -> None:
    src = parse_yaml("base: &b {x: 1, y: 2}\nother: {<<: *b, y: 3}\n")
    assert src.data["other"] == {"x": 1, "y": 3}


def test_duplicate_keys_are_refused_with_their_line() -> None:
    with pytest.raises(UcmctlError) as caught:
        parse_yaml("a: 1\nb: 2\na: 3\n", "t.yaml")
    assert str(caught.value) == "t.yaml:3 a: duplicate key 'a' (keep only one of them)"


def test_dotted_paths() -> None:
    assert dotted(("prefill", "nodes", 0)) == "prefill.nodes[0]"
    assert dotted(()) == ""
