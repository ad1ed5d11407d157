"""Counts in sentences: "1 node", "2 nodes", "1 process", "0 processes"."""

from __future__ import annotations


def counted(n: int, noun: str) -> str:
    """`n` and the noun, plural unless `n` is 1 (nouns ending in s, x or ch take -es)."""
    if n == 1:
        return f"1 {noun}"
    return f"{n} {noun}{'es' if noun.endswith(('s', 'x', 'ch')) else 's'}"
