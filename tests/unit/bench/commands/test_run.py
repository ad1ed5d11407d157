"""`ucmctl bench`'s run in steps: its options as one `RunOptions`, checked before anything is
sent, the --url target, the input lengths of the workload that takes them."""

from __future__ import annotations

import dataclasses
import inspect
import math
from pathlib import Path
from typing import Any

import pytest
import typer

from ucmctl.bench.commands import app
from ucmctl.bench.commands.run import check_options, fit_input_lengths, run, url_target
from ucmctl.bench.commands.run_options import RunOptions
from ucmctl.bench.workload_defaults import PARAMS
from ucmctl.bench.workloads import BY_KIND, MultiTurnSpec, PrefixSpec
from ucmctl.core.errors import UcmctlError

WORKLOAD_PARAMS = [param for table in PARAMS.values() for param in table.values()]


def options(**changes: Any) -> RunOptions:
    """The options of `ucmctl bench` given nothing, with `changes` (a workload's by name)."""
    values = {p.name: p.default for p in typer.main.get_command(app).params} | changes
    params = {p.name: values.pop(p.name) for p in WORKLOAD_PARAMS}
    return RunOptions.of({**values, "params": params})


def test_run_options_are_the_callbacks_parameters_in_order_then_every_workloads() -> None:
    parameters = list(inspect.signature(run).parameters)
    own = [f.name for f in dataclasses.fields(RunOptions) if f.name != "params"]
    assert parameters == ["ctx", *own, *(p.name for p in WORKLOAD_PARAMS)]
    command = {p.name: p for p in typer.main.get_command(app).params}
    for kind, table in PARAMS.items():
        assert kind in BY_KIND
        for param in table.values():  # each option as its table states it, its help naming its workload
            option = command[param.name]
            assert option.opts == [param.option] and option.default == param.default
            assert option.help == param.help and param.help.startswith(f"{kind}: ")
            assert (getattr(option, "min", None), getattr(option, "max", None)) == (param.ge, param.le)


def test_run_options_take_only_their_own_values() -> None:
    values = {f.name: f"v-{f.name}" for f in dataclasses.fields(RunOptions)}
    opts = RunOptions.of({**values, "ctx": object()})
    assert opts.url == "v-url" and opts.history_file == "v-history_file"


def test_the_defaults_check_to_the_prefix_workload_at_once() -> None:
    checked = check_options(options(history_file="off"))
    assert checked.spec.kind == "prefix"
    assert (checked.rates, checked.concurrencies) == ([math.inf], [128])
    assert (checked.slos, checked.fault, checked.history) == ({}, None, None)


def test_checked_options_sweep_and_goodput() -> None:
    checked = check_options(
        options(workload="long-doc", concurrency="1,4", request_rate="2,inf", goodput=["ttft:500"],
                history_file="off")
    )  # fmt: skip
    assert checked.spec.kind == "long-doc"
    assert (checked.rates, checked.concurrencies) == ([2.0, math.inf], [1, 4])
    assert checked.slos == {"ttft": 500.0}


@pytest.mark.parametrize(
    ("changes", "said"),
    [
        ({"workload": "nope"}, "--workload: unknown workload 'nope'"),
        ({"deployment": "a", "url": "http://x"}, "--deployment and --url both given (pass one of them)"),
        ({"url": "http://x", "fault": "kill:decode-0@30s"}, "--fault: --fault signals a process"),
        ({"request_rate": "0", "goodput": ["foo"]}, "--goodput: 'foo' is not KEY:VALUE"),  # goodput first
    ],
)
def test_options_refused_before_anything_is_sent(changes: dict[str, Any], said: str) -> None:
    with pytest.raises(UcmctlError) as caught:
        check_options(options(history_file="off", **changes))
    assert str(caught.value).startswith(said)


def test_a_url_target_reads_metrics_where_told() -> None:
    one = url_target(options(url="http://h:8000/"))
    assert one.url == "http://h:8000"
    assert [(i.name, i.role, i.url) for i in one.instances] == [("server", "server", "http://h:8000")]
    two = url_target(options(url="http://h:8000", metrics_url=["http://a:1/", "http://b:2"]))
    assert [(i.name, i.url) for i in two.instances] == [("server0", "http://a:1"), ("server1", "http://b:2")]


@pytest.mark.parametrize(
    ("changes", "said"),
    [
        ({"url": "ftp://x"}, "--url: 'ftp://x' is not an http(s) URL (e.g. http://127.0.0.1:8000, or"),
        ({"url": "http://x", "fail_fast": True}, "--fail-fast: --fail-fast watches a deployment's"),
    ],
)
def test_a_url_target_refused(changes: dict[str, Any], said: str) -> None:
    with pytest.raises(UcmctlError) as caught:
        url_target(options(**changes))
    assert str(caught.value).startswith(said)


def test_input_lengths_given_defaulted_or_refused(capsys: pytest.CaptureFixture[str]) -> None:
    given, default = PrefixSpec(), PrefixSpec()
    fit_input_lengths(options(input_len="100,200"), given, None, 10)
    fit_input_lengths(options(), default, 2048, 100)
    assert (given.input_lens, default.input_lens) == ([100, 200], [1792])  # the context's room, whole 256s
    assert "input length 1792 tokens (the default; --input-len to choose)" in capsys.readouterr().err
    fit_input_lengths(options(workload="multi-turn"), MultiTurnSpec(), None, 10)
    with pytest.raises(UcmctlError) as caught:
        fit_input_lengths(options(workload="multi-turn", input_len="100"), MultiTurnSpec(), None, 10)
    assert str(caught.value) == "--input-len: --input-len is for the prefix workload, not multi-turn"


def test_a_trace_spec_from_the_options(tmp_path: Path) -> None:
    trace = tmp_path / "t.jsonl"
    trace.write_text('{"timestamp": 0, "input_length": 10, "output_length": 2, "hash_ids": [1]}\n')
    checked = check_options(options(workload="trace", trace=trace, back_to_back=True, history_file="off"))
    assert checked.spec.describe(None) == {"workload": "trace", "trace": str(trace), "speedup": None}  # type: ignore[arg-type]
    assert checked.concurrencies == [1024]


def test_a_url_runs_names_its_engine_whose_metric_names_are_read() -> None:
    from ucmctl.engines import ENGINES

    assert url_target(options(url="http://h:1")).engine == "vllm"  # the default
    sim = url_target(options(url="http://h:1", engine="sim"))
    assert sim.engine == "sim" and sim.metrics == ENGINES["sim"].metrics


@pytest.mark.parametrize(
    ("given", "said"),
    [
        ({"url": "http://h:1", "engine": "sglang"}, "--engine: unknown engine 'sglang'"),
        ({"deployment": "d", "engine": "vllm"}, "--engine: --engine is for --url"),
    ],
)
def test_an_engine_that_is_not_one_or_not_for_a_url_is_refused(given: dict[str, str], said: str) -> None:
    with pytest.raises(UcmctlError) as refused:
        check_options(options(history_file="off", **given))
    assert refused.value.status == 2
    assert str(refused.value).startswith(said), str(refused.value)
