"""The regression gate: limits, mean + CI judgement, exit codes 0/1/2, Markdown and JUnit."""

from __future__ import annotations

from pathlib import Path
from xml.etree import ElementTree as ET

import pytest

from tests.unit.bench.helpers import cell, invoke, write_result
from ucmctl.bench.compare import compare, load_side, parse_limits
from ucmctl.bench.results import Phase
from ucmctl.core.errors import ExitStatus, UcmctlError


def measured(n: int, ttft: float) -> Phase:
    """A cell's measure phase, typed as `compare` reads it."""
    return Phase.model_validate(cell(n, ttft)["measure"])


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


def _with(path: Path, ttft: float, **prov: object) -> Path:
    """A result whose provenance says `prov` of its setup (nodes, config ...)."""
    import json

    write_result(path, [cell(1024, ttft)])
    doc = json.loads(path.read_text())
    doc["provenance"].update(prov)
    path.write_text(json.dumps(doc))
    return path


def test_one_new_sample_is_judged_against_the_baselines_prediction_interval(tmp_path: Path) -> None:
    (tmp_path / "steady").mkdir()
    (tmp_path / "noisy").mkdir()
    steady = [write_result(tmp_path / "steady" / f"{i}.json", [cell(1024, t)])
              for i, t in enumerate((100.0, 102.0, 98.0, 101.0, 99.0))]  # fmt: skip
    noisy = [write_result(tmp_path / "noisy" / f"{i}.json", [cell(1024, t)])
             for i, t in enumerate((80.0, 120.0, 100.0, 90.0, 110.0))]  # fmt: skip
    assert steady and noisy
    limits = parse_limits("ttft_mean=5%")
    new = {"ucm/1024": [measured(1024, 110.0)]}
    new["run/1024"] = new.pop("ucm/1024")
    (v,) = compare(load_side(tmp_path / "steady"), new, limits)
    # sd 1.58: the prediction interval is +-4.8% about the change of +10%: wholly worse
    assert v.regression and v.ci is not None and v.ci[0] == pytest.approx(0.10 - 0.0481, abs=0.001)
    (v,) = compare(load_side(tmp_path / "noisy"), new, limits)
    assert not v.regression and v.change == pytest.approx(0.10)  # over the limit, within the noise
    near = {"run/1024": [measured(1024, 104.0)]}
    (v,) = compare(load_side(tmp_path / "steady"), near, limits)
    assert not v.regression  # outside the interval, under the limit


def test_runs_of_another_setup_are_refused_and_the_difference_named(tmp_path: Path) -> None:
    nodes = {"n1": {"engine": "0.11.0", "torch": "2.8.0", "platform": "cuda"}}
    base = _with(tmp_path / "base.json", 100.0, nodes=nodes)
    other = _with(tmp_path / "other.json", 100.0, nodes={"n1": {**nodes["n1"], "engine": "0.11.1"}})
    both = _with(tmp_path / "both.json", 100.0, nodes={"n1": {"engine": "0.11.1", "torch": "2.9"}})
    old = write_result(tmp_path / "old.json", [cell(1024, 100.0)])  # an older ucmctl's: no node facts
    code, text = invoke("compare", str(base), str(other))
    said = " ".join(text.split())
    assert code == 2, said
    assert 'the runs differ in their setup: engine (engine@n1: "0.11.0" | "0.11.1")' in said, said
    assert "--vary engine" in said
    code, text = invoke("compare", str(base), str(other), "--vary", "engine")
    assert code == 0 and 'varied: engine@n1: "0.11.0" | "0.11.1"' in " ".join(text.split()), text
    code, text = invoke("compare", str(base), str(both), "--vary", "engine")
    assert code == 2 and "differ in more than engine: torch (torch@n1" in " ".join(text.split()), text
    code, text = invoke("compare", str(old), str(base))
    assert code == 0, text  # not known is not different


def test_against_the_history_the_last_runs_of_the_same_setup(tmp_path: Path) -> None:
    import json

    from ucmctl.bench import history

    h = tmp_path / "history.sqlite"
    for i, t in enumerate((100.0, 102.0, 98.0, 101.0, 99.0, 250.0)):  # the last: of another setup
        other = {"nodes": {"n1": {"engine": "0.9"}}} if t == 250.0 else {}
        doc = json.loads(_with(tmp_path / f"h{i}.json", t, **other).read_text())
        history.record(h, doc, command="bench", deployment="d", label=None)
    new = _with(tmp_path / "new.json", 100.5)
    history.record(h, json.loads(new.read_text()), command="bench", deployment="d", label=None)  # as run
    junit = tmp_path / "j.xml"
    code, text = invoke("compare", str(new), "--history", str(h), "--last", "3", "--junit", str(junit))
    said = " ".join(text.split())
    assert code == 0, said
    assert f"baseline: runs #3, #4, #5 of {h}" in said  # not #6 (another setup), not #7 (itself)
    assert 'tests="4"' in junit.read_text()
    slow = _with(tmp_path / "slow.json", 200.0)
    code, text = invoke("compare", str(slow), "--history", str(h), "--max-regression", "ttft_mean=10%")
    assert code == ExitStatus.REGRESSION and "runs #2, #3, #4, #5, #7" in " ".join(text.split()), text
    alone = _with(tmp_path / "alone.json", 100.0, model="another")
    code, text = invoke("compare", str(alone), "--history", str(h))
    assert code == 2 and "no earlier run of this setup (provenance key" in " ".join(text.split()), text


def test_junit_into_a_folder_that_does_not_exist_is_refused(tmp_path: Path) -> None:
    base = write_result(tmp_path / "base.json", [cell(1024, 100.0)])
    code, text = invoke("compare", str(base), str(base), "--junit", str(tmp_path / "no" / "j.xml"))
    assert code == 2 and "the folder does not exist" in text and not (tmp_path / "no").exists()


def test_the_history_baseline_of_one_label(tmp_path: Path) -> None:
    import json

    from ucmctl.bench import history

    h = tmp_path / "history.sqlite"
    for i, (t, label) in enumerate(((100.0, "main"), (300.0, "pr-1"), (101.0, "main"), (99.0, "main"))):
        doc = json.loads(_with(tmp_path / f"h{i}.json", t).read_text())
        history.record(h, doc, command="bench", deployment="d", label=label)
    new = _with(tmp_path / "new.json", 100.5)
    code, text = invoke("compare", str(new), "--history", str(h), "--baseline-label", "main")
    assert code == 0 and "baseline: runs #1, #3, #4 of" in " ".join(text.split()), text
    code, text = invoke("compare", str(new), "--history", str(h), "--baseline-label", "nightly")
    assert code == 2 and "labelled nightly in the results history" in " ".join(text.split()), text


def test_t_quantiles_and_the_correction_for_many_judgements() -> None:
    from ucmctl.bench.compare import critical_t, t95, t_quantile

    # Student's t tables: two-sided 95% and the far tails the correction reaches
    for df, q975, q999, q9995 in (
        (1, 12.706, 318.309, 636.619),
        (4, 2.776, 7.173, 8.610),
        (30, 2.042, 3.385, 3.646),
    ):
        assert abs(t_quantile(0.975, df) - q975) < 1e-3 and abs(t_quantile(0.999, df) - q999) < 1e-2
        assert abs(t_quantile(0.9995, df) - q9995) < 1e-2
    assert critical_t(4, 1) == t95(4)
    assert abs(critical_t(4, 25) - t_quantile(1 - 0.05 / 50, 4)) < 1e-9 and critical_t(4, 25) > 7


def test_the_more_judgements_the_wider_each_interval(tmp_path: Path) -> None:
    """The same +12% on one cell: flagged when it is the only judgement, not when it is one of
    twenty-four (an A/A run of a big suite would otherwise cross some interval by chance)."""
    base = {f"run/{n}": [measured(n, t) for t in (100.0, 103.0, 97.0, 101.0, 99.0)] for n in range(24)}
    new = {f"run/{n}": [measured(n, 100.0)] for n in range(24)}
    new["run/0"] = [measured(0, 112.0)]
    limits = parse_limits("ttft_mean=5%")
    (one,) = compare({"run/0": base["run/0"]}, {"run/0": new["run/0"]}, limits)
    assert one.regression
    many = compare(base, new, limits)
    assert len(many) == 24 and not any(v.regression for v in many)
