"""The regression gate: limits, mean + CI judgement, exit codes 0/1/2, Markdown and JUnit."""

from __future__ import annotations

from pathlib import Path
from xml.etree import ElementTree as ET

import pytest

from tests.unit.bench.helpers import cell, invoke, write_result
from ucmctl.bench.compare import compare, load_side, parse_limits
from ucmctl.core.errors import ExitStatus, UcmctlError


def test_parse_limits() -> None:
    limits = parse_limits("ttft_p50=5%,tpot_mean=3%, e2el_p99=0.1,output_throughput=10%")
    assert [(x.key, x.fraction, x.higher_is_better) for x in limits] == [
        ("median_ttft_ms", 0.05, False),
        ("mean_tpot_ms", 0.03, False),
        ("p99_e2el_ms", 0.1, False),
        ("output_throughput", 0.10, True),
    ]
    for bad in ("ttft_p42=5%", "latency=5%", "ttft_mean", "ttft_mean=abc", ""):
        with pytest.raises(UcmctlError):
            parse_limits(bad)


def test_exit_codes_single_samples(tmp_path: Path) -> None:
    base = write_result(tmp_path / "base.json", [cell(1024, 100.0)])
    same = write_result(tmp_path / "same.json", [cell(1024, 104.0)])
    worse = write_result(tmp_path / "worse.json", [cell(1024, 120.0)])
    code, text = invoke("compare", str(base), str(same), "--max-regression", "ttft_p50=5%")
    assert code == 0 and "OK" in text and "+4.0%" in text
    md, junit = tmp_path / "s.md", tmp_path / "j.xml"
    code, text = invoke(
        "compare",
        str(base),
        str(worse),
        "--max-regression",
        "ttft_p50=5%,tpot_mean=3%",
        "--markdown",
        str(md),
        "--junit",
        str(junit),
    )
    assert code == ExitStatus.REGRESSION == 5 and "REGRESSION" in text and "+20.0%" in text
    assert "| run/1024 | ttft_p50 |" in md.read_text()
    suite = ET.parse(junit).getroot().find("testsuite")
    assert suite is not None and suite.get("tests") == "2" and suite.get("failures") == "1"
    (failed,) = [c for c in suite.iter("testcase") if c.find("failure") is not None]
    assert failed.get("name") == "ttft_p50"
    # throughput: lower is worse
    slower = write_result(tmp_path / "slow.json", [cell(1024, 100.0, throughput=80.0)])
    assert (
        invoke("compare", str(base), str(slower), "--max-regression", "output_throughput=10%")[0]
        == ExitStatus.REGRESSION
    )


def test_bad_input_is_exit_2(tmp_path: Path) -> None:
    base = write_result(tmp_path / "base.json", [cell(1024, 100.0)])
    other = write_result(tmp_path / "other.json", [cell(2048, 100.0)])
    (tmp_path / "junk.json").write_text("{not json")
    assert invoke("compare", str(base), str(tmp_path / "missing.json"))[0] == 2
    assert invoke("compare", str(base), str(tmp_path / "junk.json"))[0] == 2
    assert invoke("compare", str(base), str(other))[0] == 2  # no cell in common
    assert invoke("compare", str(base), str(base), "--max-regression", "nope=1%")[0] == 2
    assert invoke("compare", str(base), str(base), "--repeats", "3")[0] == 2  # one sample, three asked


def _repeats(folder: Path, values: list[float]) -> Path:
    folder.mkdir()
    for i, v in enumerate(values):
        write_result(folder / f"r{i}.json", [cell(1024, v)])
    return folder


def test_repeats_judge_by_mean_and_confidence_interval(tmp_path: Path) -> None:
    base = _repeats(tmp_path / "base", [100.0, 102.0, 98.0, 101.0, 99.0])
    noisy = _repeats(tmp_path / "noisy", [80.0, 150.0, 95.0, 140.0, 85.0])  # mean +10%, CI spans 0
    shifted = _repeats(tmp_path / "shifted", [110.0, 112.0, 108.0, 111.0, 109.0])  # +10%, tight
    limits = parse_limits("ttft_mean=5%")
    (v,) = compare(load_side(base), load_side(noisy), limits, min_repeats=5)
    assert v.change == pytest.approx(0.10) and v.ci is not None and v.ci[0] < 0 and not v.regression
    (v,) = compare(load_side(base), load_side(shifted), limits, min_repeats=5)
    assert v.ci is not None and v.ci[0] > 0.05 and v.regression
    code, text = invoke(
        "compare", str(base), str(shifted), "--max-regression", "ttft_mean=5%", "--repeats", "5"
    )
    assert code == ExitStatus.REGRESSION and "(n=5)" in text
    assert (
        invoke("compare", str(base), str(noisy), "--max-regression", "ttft_mean=5%", "--repeats", "5")[0] == 0
    )


def test_every_workload_is_gated_by_its_own_cells(tmp_path: Path) -> None:
    def rounds(ttft2: float, goodput: float) -> list[dict]:
        cells = []
        for i, ttft in ((1, 100.0), (2, ttft2)):
            c = cell(900 * i, ttft)
            c.update({"workload": "multi-turn", "label": f"round {i}"})
            c["measure"]["request_goodput"] = goodput
            cells.append(c)
        trace = cell(2000, 50.0)
        trace.update({"workload": "trace", "label": "t.jsonl"})
        return [*cells, trace]

    base = write_result(tmp_path / "base.json", rounds(40.0, 4.0))
    worse = write_result(tmp_path / "worse.json", rounds(60.0, 2.0))
    code, text = invoke(
        "compare", str(base), str(worse), "--max-regression", "ttft_mean=10%,request_goodput=10%"
    )
    assert code == ExitStatus.REGRESSION
    # round 2 got slower and every multi-turn cell lost goodput; round 1's TTFT and the trace held
    assert "run/multi-turn: round 2 ttft_mean +50.0%" in text
    assert "run/multi-turn: round 1 request_goodput +50.0%" in text
    assert "run/multi-turn: round 1 ttft_mean" not in text.split("regression:")[-1]
    assert "run/trace: t.jsonl | ttft_mean" in text


def test_a_phase_that_lost_a_process_is_refused_unless_allowed(tmp_path: Path) -> None:
    base = write_result(tmp_path / "base.json", [cell(1024, 100.0)])
    hurt = cell(1024, 100.0)
    loss = {
        "process": "decode-0",
        "node": "n2",
        "how": "exited (137)",
        "phase": "measure 1024",
        "into_s": 31.0,
    }
    hurt["measure"]["lost"] = [{**loss, "log_tail": "..."}]
    lost = write_result(tmp_path / "lost.json", [hurt])
    code, text = invoke("compare", str(base), str(lost))
    assert code == ExitStatus.BAD_INPUT
    assert "run/1024: its measure phase lost decode-0 on n2 (exited (137))" in text and "lost.json" in text
    assert "--allow-lost" in text
    assert invoke("compare", str(lost), str(base))[0] == ExitStatus.BAD_INPUT  # either side
    assert invoke("compare", str(base), str(lost), "--allow-lost")[0] == ExitStatus.OK
    # a phase watched with nothing lost is judged as ever
    fine = cell(1024, 100.0)
    fine["measure"]["lost"] = []
    assert invoke("compare", str(base), str(write_result(tmp_path / "fine.json", [fine])))[0] == ExitStatus.OK


def test_a_phase_with_a_fault_injected_is_refused_unless_allowed(tmp_path: Path) -> None:
    base = write_result(tmp_path / "base.json", [cell(1024, 100.0)])
    stopped = cell(1024, 100.0)  # a SIGTERM the process shrugged off: nothing lost, still a fault
    stopped["measure"]["lost"] = []
    stopped["measure"]["fault"] = {"spec": "stop:decode-0@30s", "injected": True}
    faulted = write_result(tmp_path / "fault.json", [stopped])
    code, text = invoke("compare", str(base), str(faulted))
    assert code == ExitStatus.BAD_INPUT
    assert "run/1024: its measure phase had the fault stop:decode-0@30s injected" in text
    assert invoke("compare", str(base), str(faulted), "--allow-lost")[0] == ExitStatus.OK
    # a fault whose time never came changed nothing: judged as ever
    stopped["measure"]["fault"] = {"spec": "stop:decode-0@30s", "injected": False}
    never = write_result(tmp_path / "never.json", [stopped])
    assert invoke("compare", str(base), str(never))[0] == ExitStatus.OK
