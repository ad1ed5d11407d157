"""The capacity plot of a sweep, like `vllm bench sweep`'s Pareto plots: latency against output
throughput, one point per sweep point, connected in sweep order. Left: TTFT p50 and p99; right:
TPOT p50 and p99. Where a point has `request_goodput`, a ring sized by it is drawn around the
point and its annotation says "goodput N req/s"."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ucmctl.bench.report import check_plot_available

X_KEY = "output_throughput"
PANELS = (("ttft", "TTFT"), ("tpot", "TPOT"))
CURVES = (("median", "p50", "o", "-"), ("p99", "p99", "s", "--"))


def _figure(value: Any) -> float | None:
    """A measured figure as float; None, NaN, infinities and non-numbers are "not measured"."""
    if value is None or isinstance(value, bool):
        return None
    try:
        f = float(value)
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None


def _kept(rows: Sequence[Mapping[str, Any]], key: str, x_key: str = X_KEY) -> list[int]:
    """Indices of the rows where both the throughput and `key` were measured."""
    return [
        i
        for i, row in enumerate(rows)
        if _figure(row.get(x_key)) is not None and _figure(row.get(key)) is not None
    ]


def _series(rows: Sequence[Mapping[str, Any]], key: str, x_key: str = X_KEY) -> list[tuple[float, float]]:
    """(throughput, `key`) per row, in row order, skipping rows where either is not measured."""
    return [(float(rows[i][x_key]), float(rows[i][key])) for i in _kept(rows, key, x_key)]


def _label(row: Mapping[str, Any], i: int) -> str:
    return str(row.get("label") or f"#{i + 1}")


def _goodput(row: Mapping[str, Any]) -> float | None:
    g = _figure(row.get("request_goodput"))
    return g if g is not None and g >= 0 else None


def _slo_text(rows: Sequence[Mapping[str, Any]]) -> str:
    for row in rows:
        slos = row.get("goodput_slos_ms")
        if slos:
            return ", ".join(f"{k}<={v:g} ms" for k, v in slos.items())
    return ""


def save_capacity_plot(rows: Sequence[Mapping[str, Any]], path: Path, title: str = "") -> None:
    """PNG: TTFT (left) and TPOT (right) p50/p99 against output throughput, one point per row."""
    check_plot_available()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    goodputs = [_goodput(row) for row in rows]
    top = max((g for g in goodputs if g is not None), default=0.0)
    slos = _slo_text(rows)
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.8))
    for ax, (metric, name) in zip(axes, PANELS, strict=True):
        anchors: dict[int, tuple[float, float]] = {}  # row -> where its label goes (p99, else p50)
        for stat, stat_label, marker, style in CURVES:
            key = f"{stat}_{metric}_ms"
            kept = _kept(rows, key)
            series = _series(rows, key)
            if not series:
                continue
            xs, ys = zip(*series, strict=True)
            ax.plot(xs, ys, marker=marker, linestyle=style, label=f"{name} {stat_label}")
            for i, xy in zip(kept, series, strict=True):
                if stat == "p99" or i not in anchors:
                    anchors[i] = xy
        rings = [(i, xy) for i, xy in sorted(anchors.items()) if goodputs[i] is not None]
        if rings:
            sizes = [80 + 520 * ((goodputs[i] or 0.0) / top if top > 0 else 0.0) for i, _ in rings]
            legend = "goodput (ring size, req/s in the label)" + (f": {slos}" if slos else "")
            ax.scatter(
                [xy[0] for _, xy in rings],
                [xy[1] for _, xy in rings],
                s=sizes,
                facecolors="none",
                edgecolors="tab:green",
                linewidths=1.5,
                label=legend,
                zorder=3,
            )
        for i, (x, y) in sorted(anchors.items()):
            text = _label(rows[i], i)
            if goodputs[i] is not None:
                text += f"\ngoodput {goodputs[i]:.3g} req/s"
            ax.annotate(text, (x, y), textcoords="offset points", xytext=(6, 6), fontsize=7)
        if not anchors:
            ax.text(0.5, 0.5, "not measured", ha="center", va="center", transform=ax.transAxes)
        ax.set_xlabel("output throughput (tok/s)")
        ax.set_ylabel(f"{name} (ms)")
        ax.set_title(f"{name} vs output throughput")
        ax.grid(alpha=0.3)
        ax.margins(x=0.12, y=0.15)  # room for the labels at the ends
        if anchors:
            legend_box = ax.legend(fontsize=8)
            ax.set_ylim(bottom=0)  # latencies: the margin must not invent negative ones
            handles = getattr(legend_box, "legend_handles", None) or getattr(legend_box, "legendHandles", [])
            for handle in handles:  # a ring of plain size in the legend
                if hasattr(handle, "set_sizes"):
                    handle.set_sizes([60])
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
