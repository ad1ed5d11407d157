from __future__ import annotations

import math
import struct
from pathlib import Path
from typing import Any

import pytest

from ucmctl.bench.capacity_plot import _kept, _series, save_capacity_plot
from ucmctl.bench.sweep import Point


def row(
    point: Point, tput: float | None, ttft: float | None, tpot: float | None, **kw: Any
) -> dict[str, Any]:
    r: dict[str, Any] = {
        "label": point.label(),
        "output_throughput": tput,
        "request_throughput": None if tput is None else tput / 100,
        "median_ttft_ms": ttft,
        "p99_ttft_ms": None if ttft is None else ttft * 3,
        "median_tpot_ms": tpot,
        "p99_tpot_ms": None if tpot is None else tpot * 1.5,
    }
    r.update(kw)
    return r


ROWS = [
    row(Point(1.0, 8), 900.0, 40.0, 12.0, request_goodput=0.9, goodput_slos_ms={"ttft": 500.0, "tpot": 50.0}),
    row(
        Point(4.0, 8), 2400.0, None, 20.0, request_goodput=3.1, goodput_slos_ms={"ttft": 500.0, "tpot": 50.0}
    ),
    row(Point(math.inf, 8), 3100.0, 900.0, 45.0, request_goodput=1.2),
]


def test_series_skips_what_was_not_measured() -> None:
    assert _series(ROWS, "median_ttft_ms") == [(900.0, 40.0), (3100.0, 900.0)]
    assert _series(ROWS, "p99_ttft_ms") == [(900.0, 120.0), (3100.0, 2700.0)]
    assert _series(ROWS, "median_tpot_ms") == [(900.0, 12.0), (2400.0, 20.0), (3100.0, 45.0)]
    assert _series(ROWS, "p99_tpot_ms") == [(900.0, 18.0), (2400.0, 30.0), (3100.0, 67.5)]
    assert _kept(ROWS, "median_ttft_ms") == [0, 2]
    # no throughput, NaN, a missing key and a non-number are "not measured" too
    odd: list[dict[str, Any]] = [
        {"output_throughput": None, "median_ttft_ms": 5.0},
        {"output_throughput": 10.0, "median_ttft_ms": float("nan")},
        {"output_throughput": 20.0},
        {"output_throughput": 30.0, "median_ttft_ms": "-"},
        {"output_throughput": 40, "median_ttft_ms": 7},
    ]
    assert _series(odd, "median_ttft_ms") == [(40.0, 7.0)]
    assert _series([], "median_ttft_ms") == []


def _png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    assert data[12:16] == b"IHDR"
    assert data[-12:] == b"\x00\x00\x00\x00IEND\xaeB`\x82"  # the whole file was written
    return struct.unpack(">II", data[16:24])


def test_writes_a_png(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    out = tmp_path / "sub" / "capacity.png"
    save_capacity_plot(ROWS, out, title="sweep: rate x conc")
    assert _png_size(out) == (12 * 110, int(4.8 * 110))
    assert out.stat().st_size > 30_000  # two panels with curves and annotations, not an empty canvas


def test_without_goodput_and_without_any_figures(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    plain = [{k: v for k, v in r.items() if not k.startswith("request_goodput")} for r in ROWS]
    save_capacity_plot(plain, tmp_path / "plain.png")
    assert _png_size(tmp_path / "plain.png") == (1320, 528)
    empty = [row(Point(1.0, 1), None, None, None)]
    save_capacity_plot(empty, tmp_path / "empty.png")  # every request failed: still a plot, no crash
    assert _png_size(tmp_path / "empty.png") == (1320, 528)
    assert (tmp_path / "empty.png").stat().st_size < (tmp_path / "plain.png").stat().st_size
