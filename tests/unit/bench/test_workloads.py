"""The workloads' pure parts: the ideal (reuse) tracker, long-doc orders, sweep point names,
cell keys, merged hit rates, `--goodput A B` spreading and suites with a workload."""

from __future__ import annotations

from pathlib import Path

import pytest

from ucmctl.bench.cells import cell_key, row_name
from ucmctl.bench.commands import spread_option_values
from ucmctl.bench.hitrate import Instance, hit_rates, merge
from ucmctl.bench.reuse import ReuseTracker
from ucmctl.bench.runner import BenchConfig
from ucmctl.bench.suite import Suite
from ucmctl.bench.sweep import Point, point_name
from ucmctl.bench.workload_defaults import RepeatMode
from ucmctl.bench.workloads import LongDocSpec, MultiTurnSpec
from ucmctl.core.errors import ExitStatus, UcmctlError


def test_reuse_counts_whole_blocks_of_a_chained_prefix() -> None:
    t = ReuseTracker(block_size=4)
    a = list(range(100, 110))  # 10 tokens: blocks [0:4] and [4:8] are full
    assert t.reusable(a) == 0
    t.add(a)
    assert t.reusable(a) == 8  # two whole blocks; the last token is always computed
    assert t.reusable(a[:8]) == 4  # 8 tokens: only 7 may hit, one whole block
    assert t.reusable([*a, 1, 2, 3]) == 8
    other = [999, *a[1:]]  # a different first block: nothing after it can match either
    assert t.reusable(other) == 0
    t.add([*a, 7, 7, 7, 7, 7])  # an answer cached after the prompt: three whole blocks now
    assert t.reusable([*a, 7, 7, 7, 7, 7, 0]) == 12


def _long_doc(mode: RepeatMode, doc_tokens: int = 10) -> LongDocSpec:
    return LongDocSpec(documents=3, doc_tokens=doc_tokens, repeat_count=2, repeat_mode=mode)


def test_long_doc_orders() -> None:
    assert _long_doc("tile").order(0) == [0, 1, 2, 0, 1, 2]
    assert _long_doc("interleave").order(0) == [0, 0, 1, 1, 2, 2]
    shuffled = _long_doc("random").order(5)
    assert sorted(shuffled) == [0, 0, 1, 1, 2, 2] and shuffled == _long_doc("random").order(5)
    with pytest.raises(UcmctlError) as err:  # `ucmctl bench --repeat-mode`: a string typer does not check
        LongDocSpec.model_construct(repeat_mode="shuffle").load(Path())
    assert "--repeat-mode" in str(err.value) and err.value.status == ExitStatus.BAD_INPUT
    with pytest.raises(UcmctlError, match="--doc-tokens"):
        _long_doc("tile", doc_tokens=8000).check(500, 8192)


def test_multi_turn_sizes_and_limits() -> None:
    spec = MultiTurnSpec(users=4, rounds=3, system_tokens=100, question_tokens=10)
    assert spec.longest_prompt(20) == 100 + 3 * 10 + 2 * 20
    cfg = BenchConfig(output_len=20)
    assert spec.in_flight_tokens(cfg, 2) == 2 * (170 + 20) and spec.in_flight_tokens(cfg, 99) == 4 * 190
    assert spec.describe(cfg) == {
        "workload": "multi-turn", "users": 4, "rounds": 3, "system_tokens": 100, "question_tokens": 10,
        "answer_tokens": 20,
    }  # fmt: skip
    spec.check(20, 190)
    with pytest.raises(UcmctlError, match="max_model_len 189"):
        spec.check(20, 189)


def test_goodput_values_spread_as_click_reads_them() -> None:
    argv = ["bench", "--goodput", "ttft:500", "tpot:50", "--seed", "1", "--goodput", "e2el:9"]
    assert spread_option_values(argv) == [
        "bench", "--goodput", "ttft:500", "--goodput", "tpot:50", "--seed", "1", "--goodput", "e2el:9",
    ]  # fmt: skip
    # a subcommand or a path after the values is left alone
    assert spread_option_values(["bench", "--goodput", "ttft:5", "suite"]) == [
        "bench",
        "--goodput",
        "ttft:5",
        "suite",
    ]


def test_point_names_say_what_varies() -> None:
    one_rate = [Point(float("inf"), 1), Point(float("inf"), 8)]
    assert [point_name(p, one_rate) for p in one_rate] == ["conc 1", "conc 8"]
    rates = [Point(2.0, 4), Point(0.5, 4)]
    assert [point_name(p, rates) for p in rates] == ["rate 2", "rate 0.5"]
    both = [Point(2.0, 1), Point(2.0, 4), Point(float("inf"), 1)]
    assert point_name(both[2], both) == "rate inf conc 1"


def test_cell_keys_pair_cells_by_workload_label_and_point() -> None:
    old = {"input_len": 4096}  # a result from before labels
    assert cell_key(old) == "4096"
    assert (
        cell_key({"input_len": 1, "workload": "prefix", "label": "4096", "point_name": "conc 8"})
        == "4096 @ conc 8"
    )
    mt = {"input_len": 900, "workload": "multi-turn", "label": "round 2"}
    assert cell_key(mt) == "multi-turn: round 2" and row_name(mt) == "round 2"


def test_merged_hit_rates_are_recomputed_from_summed_counters() -> None:
    insts = [Instance("a", "mixed", "u")]

    def counters(q: float, h: float, p: float) -> dict[str, float]:
        return {
            "local_queries": q,
            "local_hits": h,
            "external_queries": 0.0,
            "external_hits": 0.0,
            "preemptions": p,
        }

    r1 = hit_rates(insts, {"a": counters(0, 0, 0)}, {"a": counters(100, 90, 1)})
    r2 = hit_rates(insts, {"a": counters(100, 90, 1)}, {"a": counters(400, 120, 3)})
    both = merge([r1, r2])
    assert both["total"]["local_hit_rate"] == pytest.approx(120 / 400)  # not the mean of 0.9 and 0.1
    assert both["total"]["preemptions"] == 3
    assert both["by_role"]["mixed"]["local_queries"] == 400
    assert both["by_instance"]["a"]["role"] == "mixed" and both["missing"] == []


def test_suite_with_a_workload() -> None:
    base = {"name": "s", "topology": "t.yaml", "output_len": 32}
    suite = Suite.model_validate({**base, "workload": {"kind": "multi-turn", "users": 8, "rounds": 3}})
    assert suite.kind == "multi-turn" and suite.cells() == [("recompute", 0, 0), ("hbm", 0, 0), ("ucm", 0, 0)]
    prefix = Suite.model_validate({**base, "input_lens": [1024]})
    assert prefix.kind == "prefix" and prefix.lengths() == [1024]
    # a prefix suite digests as it did before workloads existed: its results file still resumes
    assert "workload" not in prefix.model_dump(mode="json", exclude={"workload"})
    with pytest.raises(ValueError, match="input_lens"):
        Suite.model_validate(base)
    with pytest.raises(ValueError, match="only the prefix workload"):
        Suite.model_validate({**base, "input_lens": [1], "workload": {"kind": "long-doc"}})
