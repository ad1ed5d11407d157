"""How the report writes a figure."""

from __future__ import annotations

from ucmctl.bench.formats import ms, pct


def test_milliseconds_and_shares() -> None:
    assert [ms(None), ms(0.6), ms(99.994), ms(100), ms(12504.4)] == ["-", "0.60", "99.99", "100", "12504"]
    assert [pct(None), pct(0.797), pct(1)] == ["-", "79.7%", "100.0%"]
