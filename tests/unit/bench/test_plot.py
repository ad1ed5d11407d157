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
