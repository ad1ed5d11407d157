"""The workload registry: `ucmctl bench`'s options and a suite's `workload:` are the same specs,
their defaults stated once (in the spec); every registered workload says what the CLI, the
tables and the capacity check ask of it; suites parse and digest as before the registry."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import typer
from annotated_types import Ge, Le

from ucmctl.bench.commands import app
from ucmctl.bench.runner import BenchConfig
from ucmctl.bench.suite import Suite, load_suite
from ucmctl.bench.workloads import BY_KIND, SPECS, MultiTurnSpec, PrefixSpec, TraceSpec, WorkloadSpec
from ucmctl.core.errors import UcmctlError

from .helpers import invoke


def _options() -> dict[str, Any]:
    """`ucmctl bench`'s options by parameter name (`bench run` has the same: one function)."""
    return {p.name: p for p in typer.main.get_command(app).params}


def _fields(spec: type[WorkloadSpec]) -> dict[str, Any]:
    return {name: f for name, f in spec.model_fields.items() if name != "kind"}


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.__name__)
def test_every_spec_field_is_an_option_with_the_same_default_and_bound(spec: type[WorkloadSpec]) -> None:
    options = _options()
    for name, field in _fields(spec).items():
        if (spec, name) == (PrefixSpec, "input_lens"):  # `--input-len 4096,8192`, read as text
            assert options["input_len"].default is None and field.default_factory() == []
            continue
        option = options.get(name)
        assert option is not None, f"{spec.__name__}.{name} has no `ucmctl bench` option"
        assert f"--{name.replace('_', '-')}" in option.opts
        assert option.default == field.default, f"--{name}: {option.default!r} != {field.default!r}"
        ge = next((m.ge for m in field.metadata if isinstance(m, Ge)), None)
        le = next((m.le for m in field.metadata if isinstance(m, Le)), None)
        assert option.min == ge, f"--{name}: min {option.min} != ge {ge}"
        assert getattr(option, "max", None) == le, f"--{name}: max != le {le}"


def test_every_workload_option_is_a_spec_field() -> None:
    """An option whose help starts `KIND:` sets that workload's spec."""
    for name, option in _options().items():
        kind = (option.help or "").split(":")[0]
        # --back-to-back: speedup null; --input-len: input_lens, read as text
        if kind in BY_KIND and name not in ("back_to_back", "input_len"):
            assert name in _fields(BY_KIND[kind]), f"--{name} is not a field of {BY_KIND[kind].__name__}"


def test_the_help_states_each_workloads_defaults() -> None:
    """--output-len's and --concurrency's help list the defaults in words: the specs' numbers."""
    options = _options()
    output_help, concurrency_help = options["output_len"].help, options["concurrency"].help
    assert options["workload"].default == "prefix" and next(iter(BY_KIND)) == "prefix"
    for kind, spec in BY_KIND.items():
        assert kind in output_help and kind in concurrency_help
        if kind != "trace":  # a trace's requests have their own output lengths
            assert re.search(rf"{kind}[^;]*\b{spec.default_output_len}\b", output_help), kind
        if kind != "multi-turn":  # one per user
            assert re.search(rf"{kind} {spec().default_concurrency()}\b", concurrency_help), kind
    assert MultiTurnSpec(users=5).default_concurrency() == 5


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.__name__)
def test_every_spec_says_what_the_run_asks_of_it(spec: type[WorkloadSpec]) -> None:
    kind = spec.model_fields["kind"].default
    assert BY_KIND[kind] is spec and spec(kind=kind).kind == kind
    assert set(spec.phases) == {"preseed", "measure"}
    assert spec.default_output_len >= 1 and spec().default_concurrency() >= 1
    options = {opt for p in typer.main.get_command(app).params for opt in p.opts}
    assert spec.own_options <= options, f"{spec.__name__}.own_options names no `ucmctl bench` option"


def test_suite_workloads_parse_as_the_spec_of_their_kind(tmp_path: Path) -> None:
    base = {"name": "s", "topology": "t.yaml", "output_len": 32}
    for kind, spec in BY_KIND.items():
        lens = {"input_lens": [1]} if kind == "prefix" else {}
        suite = Suite.model_validate({**base, **lens, "workload": {"kind": kind}})
        assert suite.workload == spec() and suite.spec() == spec(**lens)
    for absent in ({}, {"workload": None}, {"workload": {}}):  # the prefix workload, the suite's keys
        suite = Suite.model_validate({**base, "input_lens": [1], "prefix_ratio": 0.5, **absent})
        assert suite.spec() == PrefixSpec(input_lens=[1], prefix_ratio=0.5) and suite.kind == "prefix"
    trace = Suite.model_validate({**base, "workload": {"kind": "trace", "trace": "t.jsonl", "speedup": None}})
    assert trace.workload == TraceSpec(trace="t.jsonl", speedup=None)  # null: back to back
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: s\ntopology: t.yaml\nworkload: {kind: multi-turn, users: 0, documents: 2}\n")
    with pytest.raises(UcmctlError) as err:
        load_suite(bad)
    # the keys as the suite writes them: no kind in between
    assert str(err.value) == (
        f"{bad}: workload.users: Input should be greater than or equal to 1; "
        "workload.documents: Extra inputs are not permitted"
    )


def test_suites_digest_as_before_the_registry() -> None:
    """A workload of the four first kinds dumps as the one flat model of all their parameters
    did: a results file written before resumes (the digests are that version's)."""
    base = {"name": "s", "topology": "t.yaml", "output_len": 32}
    multi_turn = Suite.model_validate({**base, "workload": {"kind": "multi-turn", "users": 8, "rounds": 3}})
    assert multi_turn.digest() == "18ac914a2b6f7900"
    assert multi_turn.model_dump(mode="json")["workload"] == {
        "kind": "multi-turn", "users": 8, "rounds": 3, "system_tokens": 1024, "question_tokens": 128,
        "documents": 8, "doc_tokens": 8192, "repeat_count": 2, "repeat_mode": "random", "trace": None,
        "speedup": 1.0,
    }  # fmt: skip
    trace = {"kind": "trace", "trace": "x.jsonl", "speedup": None}
    assert Suite.model_validate({**base, "workload": trace}).digest() == "a57de3795521fd90"
    prefix = {**base, "input_lens": [1]}
    assert Suite.model_validate(prefix).digest() == "1911dba102f0a4cc"  # no workload: not dumped
    assert Suite.model_validate({**prefix, "workload": {}}).digest() == "0c515a578eefadd8"


def test_a_trace_suite_reads_its_trace_relative_to_the_suite_file(tmp_path: Path) -> None:
    (tmp_path / "suites").mkdir()
    code, text = invoke("make-trace", str(tmp_path / "suites" / "t.jsonl"), "--requests", "3")
    assert code == 0, text
    spec = Suite.model_validate(
        {"name": "s", "topology": "t.yaml", "workload": {"kind": "trace", "trace": "t.jsonl"}}
    ).spec()
    spec.load(tmp_path / "suites")
    assert isinstance(spec, TraceSpec) and len(spec.requests) == 3
    assert spec.describe(BenchConfig())["trace"] == str(tmp_path / "suites" / "t.jsonl")
    with pytest.raises(UcmctlError, match=r"workload\.trace: a trace workload needs `trace: FILE`"):
        TraceSpec().load(tmp_path)


def test_the_prefix_workloads_parameters_are_the_suites_own_keys(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: s\ntopology: t.yaml\ninput_lens: [8]\nworkload: {kind: prefix, num_prompts: 4}\n")
    with pytest.raises(UcmctlError) as err:
        load_suite(bad)
    assert str(err.value) == (
        f"{bad}: workload: Value error, num_prompts: the prefix workload's parameters are the suite's own "
        "keys (input_lens, num_prompts, prefix_ratio, repeats, reset_hbm), not the workload's"
    )
    suite = Suite.model_validate(
        {"name": "s", "topology": "t.yaml", "input_lens": [8, 16], "num_prompts": 4, "repeats": 3}
    )
    assert suite.cell_spec([16]) == PrefixSpec(input_lens=[16], num_prompts=4)  # a cell runs once
