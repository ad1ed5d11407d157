from __future__ import annotations

import json
import struct
from pathlib import Path

from ucmctl.bench.report import save_plot

BASELINE = Path(__file__).resolve().parents[3] / "benchmarks" / "baselines" / "ci-sim.json"


def test_plot_is_a_png_of_ttft_and_e2el(tmp_path: Path) -> None:
    cells = json.loads(BASELINE.read_text())["cells"]  # a real suite result: 2 lengths x 3 scenarios
    out = tmp_path / "plot.png"
    save_plot(cells, out)
    data = out.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", data[16:24])  # the IHDR chunk
    assert (width, height) == (11 * 110, int(4.2 * 110))
    assert len(data) > 20_000  # two panels with three lines each, not an empty canvas


def _drawn(cells: list[dict], tmp_path: Path, monkeypatch) -> list:  # type: ignore[type-arg]
    """The plot's axes, caught before the figure is closed."""
    import matplotlib.pyplot as plt

    figures = []
    close = plt.close
    monkeypatch.setattr(plt, "close", lambda fig=None: (figures.append(fig), close(fig)))
    save_plot(cells, tmp_path / "p.png")
    (fig,) = figures
    return list(fig.axes)


def test_one_input_length_is_drawn_as_bars_not_lonely_points(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    cells = [c for c in json.loads(BASELINE.read_text())["cells"] if c["input_len"] == 1024]
    for ax in _drawn(cells, tmp_path, monkeypatch):
        assert len(ax.patches) == 3 and len(ax.lines) == 0  # a bar per scenario
        assert [t.get_text() for t in ax.get_xticklabels()] == ["recompute", "hbm", "ucm"]
        assert "input 1024 tokens" in ax.get_xlabel()


def test_the_multi_turn_aggregate_is_not_joined_to_the_rounds(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from tests.unit.bench.helpers import cell

    rounds = []
    for r, ttft in ((1, 100.0), (2, 60.0), (3, 50.0)):
        c = cell(1000 * r, ttft)
        c.update(workload="multi-turn", label=f"round {r}", round=r)
        rounds.append(c)
    summed = cell(2500, 55.0)
    summed.update(workload="multi-turn", label="rounds 2-3", round=None, aggregate=True)
    ttft, e2el = _drawn([*rounds, summed], tmp_path, monkeypatch)
    assert len(e2el.lines) == 2
    for ax in (ttft,):
        line, across = ax.lines
        assert list(line.get_ydata()) == [100.0, 60.0, 50.0]  # the rounds alone
        assert list(across.get_ydata()) == [55.0, 55.0] and across.get_linestyle() == "--"
        assert [t.get_text() for t in ax.get_xticklabels()] == ["round 1", "round 2", "round 3"]
