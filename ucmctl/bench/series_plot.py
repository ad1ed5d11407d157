"""`--plot`'s time-series figures: one PNG per phase that has server series, four panels over
the phase's seconds, one line per instance: requests running (solid) and waiting (dashed), KV
cache usage, prompt tokens per second served from the local and the external cache, and what
went wrong per second (preemptions, UCM store errors) with the tokens that came point to point."""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ucmctl.bench.results import Cell


def _rate(t: list[float], values: list[float | None]) -> tuple[list[float], list[float]]:
    """A counter's increase per second between consecutive reads (a gap or a reset: no point)."""
    xs, ys = [], []
    for i in range(1, len(values)):
        a, b, dt = values[i - 1], values[i], t[i] - t[i - 1]
        if a is None or b is None or dt <= 0 or b < a:
            continue
        xs.append(t[i])
        ys.append((b - a) / dt)
    return xs, ys


def _points(t: list[float], values: list[float | None]) -> tuple[list[float], list[float]]:
    pairs = [(x, v) for x, v in zip(t, values, strict=True) if v is not None]
    return [x for x, _ in pairs], [v for _, v in pairs]


def save_series_plots(cells: list[Cell], path: Path) -> list[Path]:
    """PNG files beside `path` (`NAME-series-01.png`, ...), one per phase with series."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written: list[Path] = []
    for cell in cells:
        for phase, p in cell.phases():
            series = p.series or {}
            t = series.get("t") or []
            if not t:
                continue
            scenario = cell.scenario
            name = f"{scenario + ' ' if scenario else ''}{cell.row_name()}, {phase}"
            fig, axes = plt.subplots(4, 1, figsize=(9, 9), sharex=True)
            for inst, s in (series.get("instances") or {}).items():
                who = f"{inst} ({s.get('role')})"
                (line,) = axes[0].plot(
                    *_points(t, s.get("running") or [None] * len(t)), marker=".", label=who
                )
                axes[0].plot(
                    *_points(t, s.get("waiting") or [None] * len(t)),
                    marker=".",
                    linestyle="--",
                    color=line.get_color(),
                )
                usage = [None if v is None else 100 * v for v in s.get("kv_usage") or [None] * len(t)]
                axes[1].plot(*_points(t, usage), marker=".", color=line.get_color(), label=who)
                for key, style in (("local_hits", "-"), ("external_hits", "--")):
                    if key in s:
                        axes[2].plot(
                            *_rate(t, s[key]),
                            marker=".",
                            linestyle=style,
                            color=line.get_color(),
                            label=f"{inst} {key.split('_')[0]}",
                        )
                for key, style in (
                    ("preemptions", "-"),
                    ("ucm_load_errors", "--"),
                    ("ucm_save_errors", ":"),
                    ("kv_transfer_tokens", "-."),
                ):
                    if key in s and any(v for v in s[key] if v):
                        axes[3].plot(*_rate(t, s[key]), marker=".", linestyle=style, label=f"{inst} {key}")
            axes[0].set_ylabel("requests\nrunning (-), waiting (--)")
            axes[1].set_ylabel("KV cache usage, %")
            axes[2].set_ylabel("prompt tokens/s hit\nlocal (-), external (--)")
            axes[3].set_ylabel("per second")
            axes[3].set_xlabel(f"seconds into the phase (a read every {series.get('interval_s')} s)")
            for ax in axes:
                ax.grid(alpha=0.3)
                ax.set_ylim(bottom=0)
                if ax.get_legend_handles_labels()[0]:
                    ax.legend(fontsize=7, loc="upper right")
            if not axes[3].get_legend_handles_labels()[0]:
                axes[3].text(
                    0.5,
                    0.5,
                    "no preemption, store error or P2P transfer",
                    ha="center",
                    va="center",
                    transform=axes[3].transAxes,
                    fontsize=9,
                    color="gray",
                )
            fig.suptitle(f"server series: {name}")
            fig.tight_layout()
            slug = re.sub(r"[^A-Za-z0-9.]+", "-", f"{name}").strip("-")
            out = path.with_name(f"{path.stem}-series-{len(written) + 1:02d}-{slug}.png")
            fig.savefig(out, dpi=90)
            plt.close(fig)
            written.append(out)
    return written
