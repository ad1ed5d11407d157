"""Prometheus's text exposition, read: every sample of a /metrics page as (name, labels, value).

One reader for everything ucmctl takes from a server's or the proxy's /metrics (hit counters,
capacity, time series, the KV handover, a fault's counters, the KV probe): comments and lines
that are not samples are skipped, a sample's optional timestamp is not taken for its value, and
a value that is not a number (a server mid-restart writing garbage) is skipped, never a crash.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass

_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)(?:\s+-?\d+)?\s*$")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


@dataclass(frozen=True)
class Sample:
    name: str
    labels_text: str  # between the braces, as written ('' without labels)
    value: float

    @property
    def labels(self) -> dict[str, str]:
        return dict(_LABEL.findall(self.labels_text))

    def label(self, key: str) -> str | None:
        return self.labels.get(key)


def samples(text: str, prefixes: tuple[str, ...] = ()) -> Iterator[Sample]:
    """Every sample of `text`; with `prefixes`, only those whose name starts with one of them
    (the rest are skipped before any parsing: a vLLM page has thousands of histogram lines)."""
    for line in text.splitlines():
        if not line or line[0] == "#" or (prefixes and not line.startswith(prefixes)):
            continue
        m = _SAMPLE.match(line)
        if m is None:
            continue
        try:
            value = float(m[3])
        except ValueError:
            continue
        yield Sample(m[1], m[2] or "", value)


def total(text: str, names: set[str] | frozenset[str]) -> float | None:
    """The sum of the samples of `names` (a counter's name with and without `_total`, say) over
    every label set; None when there is none."""
    found = [s.value for s in samples(text) if s.name in names]
    return sum(found) if found else None
