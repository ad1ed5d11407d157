"""The calibration fit: a prompt length's cost is the fastest of its repeats."""

from __future__ import annotations

import pytest

from ucmctl.sim.calibrate import fit


def _points(prefill: list[tuple[float, float]]) -> dict[str, list[tuple[float, float]]]:
    return {
        "prefill": prefill,
        "decode": [(1.0, 25.0), (4.0, 25.0)],
        "context": [(32.0, 25.0), (512.0, 25.0)],
    }


def test_one_run_slowed_by_the_machine_does_not_move_the_prefill_fit() -> None:
    # 0.5 ms a token; one run of the longest prompt waited behind a neighbour for over a second.
    runs = [(n, n * 0.5 + 2.0 * i) for n in (256.0, 512.0, 1024.0) for i in range(3)]
    runs[-1] = (1024.0, 1024 * 0.5 + 1300)
    profile = fit(_points(runs), kv_bytes_per_token=2048, source="test")
    assert profile.prefill_ms(1024, 0) == pytest.approx(512, rel=0.01)
    assert profile.prefill_ms(256, 0) == pytest.approx(128, rel=0.01)
    assert profile.base_ms == pytest.approx(0, abs=0.5)
    assert profile.decode_ms(4, 0) == pytest.approx(25, rel=0.01)


def test_the_fit_still_follows_the_prompt_length() -> None:
    runs = [(n, 10 + n * 0.2) for n in (128.0, 256.0, 2048.0)]
    profile = fit(_points(runs), kv_bytes_per_token=2048, source="test")
    assert profile.base_ms + profile.prefill_ms(2048, 0) == pytest.approx(10 + 2048 * 0.2, rel=0.01)
    assert profile.base_ms == pytest.approx(10, abs=0.5)
