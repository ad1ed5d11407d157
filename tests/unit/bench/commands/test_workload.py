"""What `ucmctl bench` makes of the workload options: the spec from its own checks, an option
of another workload refused naming the one that takes it."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

from ucmctl.bench.commands.workload import foreign_option, spec_of
from ucmctl.bench.workloads import BY_KIND, LongDocSpec, PrefixSpec, TraceSpec
from ucmctl.core.errors import UcmctlError

from .test_run import options


def _values(**changes: Any) -> dict[str, Any]:
    return options(**changes).params


def test_each_option_only_one_workload_takes_names_it() -> None:
    owners = {option: [k for k, s in BY_KIND.items() if option in s.own_options]
              for option in ("--input-len", "--fault", "--trace")}  # fmt: skip
    assert owners == {"--input-len": ["prefix"], "--fault": ["prefix"], "--trace": ["trace"]}
    said = foreign_option("long-doc", "--fault")
    assert str(said) == "--fault: --fault is for the prefix workload, not long-doc"
    said = foreign_option("prefix", "--trace", fix="add --workload trace")
    assert str(said) == "--trace: --trace is for the trace workload, not prefix (add --workload trace)"


def test_a_field_of_another_workload_given_is_refused_first(tmp_path: Path) -> None:
    with pytest.raises(UcmctlError) as caught:
        spec_of("long-doc", _values(trace=tmp_path / "t.jsonl", repeat_mode="bad"))
    said = "--trace: --trace is for the trace workload, not long-doc (add --workload trace)"
    assert str(caught.value) == said


def test_the_spec_from_the_options_named_as_its_fields() -> None:
    spec = spec_of("long-doc", _values(documents=3, doc_tokens=100, repeat_mode="tile"))
    assert isinstance(spec, LongDocSpec)
    assert (spec.documents, spec.doc_tokens, spec.repeat_count, spec.repeat_mode) == (3, 100, 2, "tile")
    assert isinstance(spec_of("prefix", _values()), PrefixSpec)


def test_the_trace_workload_needs_a_trace_and_is_sent_on_its_timestamps(tmp_path: Path) -> None:
    with pytest.raises(UcmctlError) as caught:
        TraceSpec.from_options(_values())
    assert str(caught.value).startswith("--trace: the trace workload needs a trace (--trace FILE.jsonl")
    trace = tmp_path / "t.jsonl"
    on_time = TraceSpec.from_options(_values(trace=trace, speedup=2.0))
    assert isinstance(on_time, TraceSpec) and (on_time.trace, on_time.speedup) == (str(trace), 2.0)
    back_to_back = TraceSpec.from_options(_values(trace=trace, speedup=2.0, back_to_back=True))
    assert isinstance(back_to_back, TraceSpec) and back_to_back.speedup is None
    on_time.check_rates([math.inf])
    with pytest.raises(UcmctlError) as caught:
        on_time.check_rates([2.0, math.inf])
    said = "--request-rate: a trace is sent on its own timestamps (use --speedup or --back-to-back)"
    assert str(caught.value) == said
    PrefixSpec().check_rates([2.0, math.inf])  # any rate
