"""The per-phase extras: the registry's order, each extra's fields on the typed phase, and the
lines each says for one phase (exact text, style and markup)."""

from __future__ import annotations

from typing import Any

import pytest

from ucmctl.bench import extras
from ucmctl.bench.extras import EXTRAS, Note, PhaseView
from ucmctl.bench.extras.preemptions import preemptions
from ucmctl.bench.extras.store_errors import store_errors
from ucmctl.bench.results import Cell, Phase
from ucmctl.core.store_errors import describe


def view(key: str = "measure", cell: dict[str, Any] | None = None, **phase: Any) -> PhaseView:
    typed = Cell.model_validate({"input_len": 64, **(cell or {}), key: {"completed": 8, **phase}})
    got = getattr(typed, key)
    assert got is not None
    return PhaseView(key, f"{key} 64", "64", typed, got)


def said(name: str, v: PhaseView) -> list[Note]:
    (extra,) = [e for e in EXTRAS if e.name == name]
    return list(extra.lines(v))


def test_the_registry_says_its_extras_in_the_report_order() -> None:
    assert [e.name for e in EXTRAS] == [
        "failures", "preemptions", "lost", "handover", "paths", "fault", "store errors", "goodput",
        "trace lag", "hit rates", "series",
    ]  # fmt: skip


def test_the_phase_has_every_extras_fields() -> None:
    declared = [e.fields for e in EXTRAS if e.fields is not None]
    assert all(issubclass(Phase, fields) for fields in declared)
    assert {f for fields in declared for f in fields.model_fields} == {
        "lost", "kv_handover", "paths", "fault", "request_goodput", "good_completed", "goodput_slos_ms",
        "send_lag_ms", "series",
    }  # fmt: skip


def test_a_phase_without_extras_says_nothing() -> None:
    assert list(extras.notes(view())) == []
    assert list(extras.notes(view("preseed", hit_rate={"total": None}))) == []


def test_failures_are_said_per_error_but_not_for_an_aggregate() -> None:
    errors = [{"error": "HTTP 500: boom", "count": 2}]
    assert said("failures", view(errors=errors)) == [Note("measure 64: 2 x HTTP 500: boom", "red")]
    assert said("failures", view(cell={"aggregate": True}, errors=errors)) == []


def test_preemptions_and_store_errors_read_the_total() -> None:
    total = {"preemptions": 3.0, "ucm_load_waits_over_bound": 4, "ucm_save_errors": 0}
    assert preemptions(total) == 3 and preemptions(None) is None
    assert store_errors({"ucm_save_errors": 0}) is None
    notes = said("preemptions", view(hit_rate={"total": total}))
    full = "measure 64: 3 preemption(s): the KV cache was full (figures include them)"
    assert notes == [Note(full, "yellow")]
    words = describe({"load_waits_over_bound": 4, "save": 0}, words=True)
    assert words and store_errors(total) == words
    assert said("store errors", view(hit_rate={"total": total})) == [
        Note(f"measure 64: UCM store: {words} (misses are recomputed)", "yellow")
    ]


def test_lost_handover_and_lag_are_typed_and_said() -> None:
    v = view(
        lost=[{"process": "decode0", "node": "n1", "how": "exited (137)", "into_s": 12.6, "at": 1.0}],
        kv_handover={"count": 7, "mean_ms": 12.345, "p50_ms": 150.0, "p99_ms": None},
        send_lag_ms={"p50": 0.12, "p99": 3.4567, "max": 10, "mean": 1},
        mean_ttft_ms=250,
    )
    assert v.phase.kv_handover is not None and v.phase.kv_handover.count == 7
    assert said("lost", v) == [
        Note(
            "measure 64: lost decode0 on n1 (exited (137), 13 s in): figures include the time without it",
            "red",
        )
    ]
    assert said("handover", v) == [
        Note("measure 64: KV handover (proxy, 7 streamed): mean 12.35, p50 150, p99 - ms; TTFT mean 250 ms")
    ]
    assert said("handover", view("preseed", kv_handover={"count": 7})) == []  # measure phases only
    assert said("trace lag", v) == [
        Note("measure 64: sends behind the trace's schedule by 0.12 ms p50, 3.46 ms p99, 10.00 ms max")
    ]
    assert said("trace lag", view(send_lag_ms={"p50": None, "p99": None})) == []


def test_goodput_and_fault() -> None:
    slos = {"ttft": 200, "e2el": 1500.5}
    v = view(failed=2, request_goodput=1.23456, good_completed=5, goodput_slos_ms=slos)
    assert said("goodput", v) == [
        Note("measure 64: goodput 1.23 req/s (5 of 10 requests met ttft <= 200 ms, e2el <= 1500.5 ms)")
    ]
    fault = {"spec": "stop:prefill0@1s", "injected": False, "why": "no such process"}
    assert said("fault", view(fault=fault)) == [
        Note("measure 64: fault stop:prefill0@1s not injected: no such process")
    ]


@pytest.mark.parametrize("workload", ["prefix", "multi-turn"])
def test_hit_rates_by_role_a_cached_preseed_and_unread_instances(workload: str) -> None:
    rates = {
        "total": {"hit_rate": 0.5},
        "by_role": {"prefill": {"local_hit_rate": 0.25, "external_hit_rate": 0.5, "hit_rate": 0.3},
                    "decode": {"local_hit_rate": None, "external_hit_rate": 0.1}},
        "restarted": ["decode0"],
        "missing": ["prefill1"],
    }  # fmt: skip
    notes = said("hit rates", view("preseed", cell={"workload": workload, "scenario": "ucm"}, hit_rate=rates))
    assert notes[0] == Note(
        "ucm preseed 64 hit rates: prefill local 25.0%, external 50.0%; decode local -, external 10.0%"
    )
    cached = [n for n in notes if "already cached" in n.text]
    assert [n.text[:50] for n in cached] == (["[yellow]preseed 64: 30.0% of its prompt tokens wer"] if
                                             workload == "prefix" else [])  # fmt: skip
    assert notes[-2].text.startswith("[yellow]preseed 64: decode0 started again within the phase")
    assert notes[-1] == Note("[yellow]no /metrics from prefill1: hit rate without them[/]", markup=None)


def test_the_paths_requests_took_are_said_when_some_went_straight_to_decode() -> None:
    v = view(paths={"disaggregated": 80, "direct": 20})
    assert said("paths", v) == [
        Note(
            "measure 64: paths (proxy): 80 prefill then decode, 20 whole on one instance (it prefilled "
            "them itself)"
        )
    ]
    assert said("paths", view()) == []
    busy = view(paths={"disaggregated": 80, "direct": 20, "direct_saturated": 5})
    assert said("paths", busy) == [
        Note(
            "measure 64: paths (proxy): 80 prefill then decode, 25 whole on one instance (it prefilled "
            "them itself; 5 of them as every prefill instance was busy)"
        )
    ]


def test_the_paths_of_a_phase_are_the_proxys_counter_deltas() -> None:
    from ucmctl.bench.paths import parse, phase_counts

    text = (
        'ucmctl_proxy_requests_by_path_total{path="disaggregated"} 10.0\n'
        'ucmctl_proxy_requests_by_path_total{path="direct"} 3.0\n'
    )
    before = parse(text)
    assert before == {"disaggregated": 10.0, "direct": 3.0, "direct_saturated": 0.0}
    after = parse(text.replace("10.0", "15.0").replace("3.0", "7.0"))
    assert phase_counts(before, after) == {"disaggregated": 5, "direct": 4, "direct_saturated": 0}
    assert phase_counts(before, before) is None  # none went direct: nothing to say
    busy = parse(text + 'ucmctl_proxy_requests_by_path_total{path="direct_saturated"} 2.0\n')
    assert phase_counts(before, busy) == {"disaggregated": 0, "direct": 0, "direct_saturated": 2}
    assert phase_counts(after, before) is None  # the proxy started again: its counters fell
    assert phase_counts(None, after) is None
