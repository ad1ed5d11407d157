"""A Prometheus histogram kept as plain numbers and written out as text on scrape: the proxy's
and the simulator's (which writes vLLM's)."""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterable


class Histogram:
    """A cumulative Prometheus histogram over fixed upper bounds. `count_first`: `_count`
    before `_sum`, as prometheus_client (and so vLLM) writes them; the proxy writes `_sum` first."""

    def __init__(self, bounds: Iterable[float], *, count_first: bool = False) -> None:
        self.bounds = tuple(sorted(bounds))
        self.counts = [0] * (len(self.bounds) + 1)  # the last slot is +Inf
        self.sum = 0.0
        self.count = 0
        self.count_first = count_first

    def observe(self, value: float) -> None:
        """Add one observation."""
        # bisect_left: a value equal to a bound belongs to that bucket (le = less or equal)
        self.counts[bisect_left(self.bounds, value)] += 1
        self.sum += value
        self.count += 1

    def lines(self, name: str, labels: str = "") -> list[str]:
        """The _bucket, _sum and _count samples of this histogram; `labels` as written between
        the braces (`engine="0",model_name="m"`), without `le`."""
        sep = "," if labels else ""
        out, running = [], 0
        for bound, n in zip((*self.bounds, float("inf")), self.counts, strict=True):
            running += n
            out.append(f'{name}_bucket{{{labels}{sep}le="{number(bound)}"}} {running}')
        tail = f"{{{labels}}}" if labels else ""
        total = [f"{name}_sum{tail} {number(self.sum)}", f"{name}_count{tail} {self.count}"]
        return out + (total[::-1] if self.count_first else total)


def number(value: float) -> str:
    """A sample's value or a bound as the text format writes it: `+Inf`, `1.0`, `0.25`."""
    if value == float("inf"):
        return "+Inf"
    return repr(float(value)) if not float(value).is_integer() else f"{value:.1f}"
