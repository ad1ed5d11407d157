"""A workload parameter stated once: its spec's field and `ucmctl bench`'s option take the same
default and lower bound, and the option its help, from the table."""

from __future__ import annotations

import inspect

import pytest
from pydantic import ValidationError

from ucmctl.bench.commands import run
from ucmctl.bench.workload_defaults import LONG_DOC_PARAMS, MULTI_TURN_PARAMS, Param
from ucmctl.bench.workloads import LongDocSpec, MultiTurnSpec

TABLES = [(MultiTurnSpec, p) for p in MULTI_TURN_PARAMS.values()] + [
    (LongDocSpec, p) for p in LONG_DOC_PARAMS.values()
]


@pytest.mark.parametrize(("spec", "param"), TABLES, ids=lambda x: getattr(x, "name", ""))
def test_the_field_and_the_option_read_one_parameter(spec: type, param: Param) -> None:
    field = spec.model_fields[param.name]
    assert field.default == param.default
    bounds = [getattr(m, "ge", None) for m in field.metadata if hasattr(m, "ge")]
    assert bounds == ([] if param.ge is None else [param.ge])
    option = inspect.signature(run.run).parameters[param.name].default
    assert option.default == param.default and option.min == param.ge and option.help == param.help
    assert option.param_decls == (param.option,)
    if param.ge is not None:
        with pytest.raises(ValidationError, match=f"greater than or equal to {param.ge}"):
            spec(**{param.name: param.ge - 1})


def test_the_table_names_the_options() -> None:
    assert [p.option for p in MULTI_TURN_PARAMS.values()] == [
        "--users", "--rounds", "--system-tokens", "--question-tokens",
    ]  # fmt: skip
    assert LONG_DOC_PARAMS["repeat_mode"].default == "random" and LONG_DOC_PARAMS["repeat_mode"].ge is None
