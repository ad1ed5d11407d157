"""The one Prometheus histogram: cumulative buckets, `le` inclusive, `_sum`/`_count` in the order
each writer keeps (the proxy's, prometheus_client's for the simulator)."""

from __future__ import annotations

from ucmctl.core.histogram import Histogram, number


def test_buckets_are_cumulative_with_le_inclusive() -> None:
    h = Histogram([1.0, 0.1])  # sorted on the way in
    for v in (0.05, 0.1, 0.5, 3.0):
        h.observe(v)
    assert h.lines("x") == [
        'x_bucket{le="0.1"} 2',
        'x_bucket{le="1.0"} 3',
        'x_bucket{le="+Inf"} 4',
        "x_sum 3.65",
        "x_count 4",
    ]


def test_labels_and_count_first() -> None:
    h = Histogram([0.1, 1.0], count_first=True)
    for v in (0.05, 0.5, 0.7, 3.0):
        h.observe(v)
    assert h.lines("x", 'a="1"') == [
        'x_bucket{a="1",le="0.1"} 1',
        'x_bucket{a="1",le="1.0"} 3',
        'x_bucket{a="1",le="+Inf"} 4',
        'x_count{a="1"} 4',
        'x_sum{a="1"} 4.25',
    ]


def test_an_empty_histogram_and_the_numbers() -> None:
    empty = ['y_bucket{le="2.5"} 0', 'y_bucket{le="+Inf"} 0', "y_sum 0.0", "y_count 0"]
    assert Histogram([2.5]).lines("y") == empty
    assert [number(v) for v in (float("inf"), 10, 0.0005, 2560.0)] == ["+Inf", "10.0", "0.0005", "2560.0"]
