"""What `bench` reads of the proxies over a phase, replicas added up: the KV handover and the
paths requests took, of the replicas read at both ends (one that died took its counts along)."""

from __future__ import annotations

import math

from ucmctl.bench import handover
from ucmctl.bench.runner import _proxy_figures


def reading(fast: float, slow: float, direct: float, disaggregated: float) -> tuple:
    buckets = [(0.01, fast), (0.1, fast + slow), (math.inf, fast + slow)]
    return (buckets, 0.005 * fast + 0.05 * slow, fast + slow), {
        "disaggregated": disaggregated, "direct": direct, "direct_saturated": 0.0
    }  # fmt: skip


def test_replicas_are_added_up_and_one_gone_at_the_end_is_left_out() -> None:
    before = {"a": reading(1, 0, 0, 1), "b": reading(0, 1, 1, 1), "c": reading(5, 5, 5, 5)}
    after = {"a": reading(3, 0, 2, 3), "b": reading(0, 3, 1, 3)}  # c died in the phase
    figures = _proxy_figures(before, after)
    # a: 2 fast handovers (5 ms), 2 requests direct; b: 2 slow ones (50 ms), none direct
    assert figures["kv_handover"]["count"] == 4 and round(figures["kv_handover"]["mean_ms"], 6) == 27.5
    assert figures["paths"] == {"disaggregated": 4, "direct": 2, "direct_saturated": 0}
    assert _proxy_figures(before, {}) == {} and _proxy_figures(None, after) == {}


def test_histograms_of_other_buckets_are_not_added() -> None:
    a = reading(1, 1, 0, 0)[0]
    other = ([(0.5, 1.0), (math.inf, 1.0)], 0.2, 1.0)
    assert handover.merged([a, other]) is None and handover.merged([a, None]) is None
    assert handover.merged([a]) == a
