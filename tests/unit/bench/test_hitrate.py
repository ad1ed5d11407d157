from __future__ import annotations

import pytest

from ucmctl.bench.hitrate import Instance, hit_rates, parse_counters

EXPOSITION = """# HELP vllm:prefix_cache_queries Prefix cache queries, in tokens.
# TYPE vllm:prefix_cache_queries counter
vllm:prefix_cache_queries_total{engine="0",model_name="m"} 1000.0
vllm:prefix_cache_queries_total{engine="1",model_name="m"} 500.0
vllm:prefix_cache_queries_created{engine="0",model_name="m"} 1.7e9
vllm:prefix_cache_hits_total{engine="0",model_name="m"} 300.0
vllm:external_prefix_cache_queries_total{engine="0",model_name="m"} 1200.0
vllm:external_prefix_cache_hits_total{engine="0",model_name="m"} 960.0
vllm:prefix_cache_hits_bogus 5
vllm:num_preemptions_total{engine="0",model_name="m"} 3.0
vllm:num_preemptions_total{engine="1",model_name="m"} 4.0
"""


def test_parse_sums_engines_and_ignores_created() -> None:
    c = parse_counters(EXPOSITION)
    ucm = {k: v for k, v in c.items() if k.startswith("ucm_")}
    assert ucm and set(ucm.values()) == {0.0}  # a server without the UCM connector
    assert {k: v for k, v in c.items() if k not in ucm} == {
        "local_queries": 1500.0,
        "local_hits": 300.0,
        "external_queries": 1200.0,
        "external_hits": 960.0,
        "preemptions": 7.0,
    }


def test_storage_errors_of_a_phase_are_read_and_said_by_kind() -> None:
    from ucmctl.bench.report import storage_errors_of

    text = EXPOSITION + "\n".join(
        [
            'vllm:ucm_load_errors_total{engine="0",model_name="m"} 24.0',
            'vllm:ucm_load_errors_enotconn_total{engine="0",model_name="m"} 20.0',
            'vllm:ucm_load_errors_timeout_total{engine="0",model_name="m"} 3.0',
            'vllm:ucm_load_errors_timeout_total{engine="1",model_name="m"} 1.0',
            'vllm:ucm_save_errors_total{engine="0",model_name="m"} 2.0',
            'vllm:ucm_save_errors_dropped_total{engine="0",model_name="m"} 2.0',
        ]
    )
    inst = [Instance("d0", "decode", "http://b")]
    phase = {"hit_rate": hit_rates(inst, {"d0": parse_counters(EXPOSITION)}, {"d0": parse_counters(text)})}
    said = storage_errors_of(phase)
    assert said == "24 block load(s) missed (enotconn 20, timeout 4); 2 block save(s) failed (dropped 2)"
    assert (
        storage_errors_of(
            {"hit_rate": hit_rates(inst, {"d0": parse_counters(text)}, {"d0": parse_counters(text)})}
        )
        is None
    )


def test_rates_are_deltas_per_instance_role_and_total() -> None:
    insts = [
        Instance("p0", "prefill", "http://a"),
        Instance("d0", "decode", "http://b"),
        Instance("d1", "decode", "http://c"),
    ]
    zero = dict.fromkeys(("local_queries", "local_hits", "external_queries", "external_hits"), 0.0)
    before = {"p0": dict(zero, local_queries=100.0, local_hits=50.0), "d0": dict(zero), "d1": dict(zero)}
    after = {
        "p0": {
            "local_queries": 1100.0,
            "local_hits": 50.0,
            "external_queries": 1000.0,
            "external_hits": 800.0,
        },
        "d0": {"local_queries": 1000.0, "local_hits": 800.0, "external_queries": 0.0, "external_hits": 0.0},
        "d1": None,  # /metrics did not answer
    }
    r = hit_rates(insts, before, after)
    assert r["missing"] == ["d1"]
    assert r["by_instance"]["p0"]["external_hit_rate"] == pytest.approx(0.8)
    assert r["by_instance"]["p0"]["local_hit_rate"] == 0.0
    assert r["by_role"]["decode"]["local_hit_rate"] == pytest.approx(0.8)
    assert r["by_role"]["decode"]["external_hit_rate"] is None  # no queries: no rate, not 0
    total = r["total"]
    assert total["local_queries"] == 2000 and total["external_hits"] == 800
    assert total["hit_rate"] == pytest.approx((800 + 800) / 2000)


def test_a_server_restarted_within_the_phase_counts_from_its_restart() -> None:
    insts = [Instance("d0", "decode", "http://b"), Instance("d1", "decode", "http://c")]
    zero = dict.fromkeys(("local_queries", "local_hits", "external_queries", "external_hits"), 0.0)
    before = {"d0": dict(zero, external_queries=5000.0, external_hits=4000.0), "d1": dict(zero)}
    # d0 was killed and started again: its counters began again at 0 (a delta would be -4000)
    after = {"d0": dict(zero, external_queries=1000.0, external_hits=900.0),
             "d1": dict(zero, external_queries=2000.0, external_hits=1000.0)}  # fmt: skip
    r = hit_rates(insts, before, after)
    assert r["restarted"] == ["d0"] and r["missing"] == []
    assert r["by_instance"]["d0"]["external_hit_rate"] == pytest.approx(0.9)
    assert r["by_role"]["decode"]["external_hits"] == 1900
    assert r["by_role"]["decode"]["external_hit_rate"] == pytest.approx(1900 / 3000)


def test_a_restart_is_seen_by_the_process_start_time_even_when_counters_grew_past_it() -> None:
    insts = [Instance("d0", "decode", "http://b")]
    zero = dict.fromkeys(("local_queries", "local_hits", "external_queries", "external_hits"), 0.0)
    before = {"d0": dict(zero, external_queries=500.0, external_hits=400.0, started=1000.0)}
    after = {"d0": dict(zero, external_queries=1500.0, external_hits=1400.0, started=2000.0)}
    r = hit_rates(insts, before, after)
    assert r["restarted"] == ["d0"]
    assert r["by_instance"]["d0"]["external_hits"] == 1400  # since its restart, not 1400 - 400
    same = hit_rates(insts, before, {"d0": dict(after["d0"], started=1000.0)})
    assert same["restarted"] == [] and same["by_instance"]["d0"]["external_hits"] == 1000
