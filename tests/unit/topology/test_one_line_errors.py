"""Input that is not one line of plain text is refused in one line, the way a user runs ucmctl."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from ucmctl.core.errors import UcmctlError
from ucmctl.topology.load import parse_topology
from ucmctl.topology.source import dotted
from ucmctl.topology.text import one_line, refused_char

BAD = Path(__file__).parent / "bad"
NOT_ONE_LINE = [
    "38-env-key-newline",
    "39-flag-name-newline",
    "40-storage-backends-string-newline",
    "41-served-name-nul",
    "42-storage-backend-colon",
    "43-bind-not-an-ip",
    "44-infinite-capacity",
    "45-lone-surrogate-escape",
    "46-proxy-host-not-an-ip",
]


def _expectation(path: Path) -> str:
    return path.read_text().splitlines()[0].split("expect: ", 1)[1].strip()


@pytest.mark.parametrize("name", NOT_ONE_LINE)
def test_cli_refuses_in_exactly_one_line(name: str) -> None:
    path = BAD / f"{name}.yaml"
    run = subprocess.run(
        [sys.executable, "-m", "ucmctl", "validate", str(path)], capture_output=True, text=True
    )
    assert run.returncode == 2
    assert "Traceback" not in run.stderr + run.stdout
    assert run.stderr.count("\n") == 1 and run.stderr.endswith("\n"), repr(run.stderr)
    line = run.stderr.rstrip("\n")
    assert line.startswith(f"error: {path}:") and _expectation(path) in line
    assert refused_char(line) is None


MINIMAL = """
name: t
mode: mixed
model: {{path: /models/m{extra}}}
nodes:
  a: {{host: 10.0.0.1, env: {{{env}}}}}
mixed: {{nodes: [a]{flags}}}
"""


def _problems(extra: str = "", env: str = "", flags: str = "") -> list[str]:
    with pytest.raises(UcmctlError) as caught:
        parse_topology(MINIMAL.format(extra=extra, env=env, flags=flags), "t.yaml")
    return [p.render() for p in caught.value.problems]


@pytest.mark.parametrize(
    ("where", "expect"),
    [
        ({"env": '"A\\u2028B": x'}, "key 'A\\u2028B' holds the character '\\u2028'"),
        ({"env": 'A: "x\\ty"'}, "'x\\ty' holds a tab"),
        ({"env": 'A: "x\\x1b[31m"'}, "'x\\x1b[31m' holds the control character '\\x1b'"),
        ({"extra": ', served_name: "a\\x85b"'}, "'a\\x85b' holds the control character '\\x85'"),
        ({"flags": ', flags: {"enforce-eager\\r": true}'}, "key 'enforce-eager\\r' holds a carriage return"),
        ({"extra": ", served_name: -x"}, "served_name '-x' is empty or starts with '-'"),
        ({"extra": ", served_name: ''"}, "served_name '' is empty or starts with '-'"),
        ({"flags": ", flags: {'max-model-len ': 1}"}, "'max-model-len ' is not a vLLM flag name"),
        ({"env": "'A ': x"}, "'A ' is not a valid environment variable name"),
    ],
)
def test_each_problem_is_one_line_naming_file_key_and_value(where: dict[str, str], expect: str) -> None:
    problems = _problems(**where)
    assert len(problems) == 1 and expect in problems[0], problems
    assert problems[0].startswith("t.yaml:") and refused_char(problems[0]) is None


def test_model_path_starting_with_a_dash_is_refused() -> None:
    text = MINIMAL.format(extra="", env="", flags="").replace("/models/m", "--help")
    with pytest.raises(UcmctlError) as caught:
        parse_topology(text, "t.yaml")
    (problem,) = [p.render() for p in caught.value.problems]
    assert problem.startswith("t.yaml:4 model.path: model path '--help' starts with '-'")


def test_keys_that_are_not_plain_are_quoted_in_the_location() -> None:
    assert dotted(("nodes", "a", "env", "A\nB")) == "nodes.a.env.'A\\nB'"
    assert dotted(("mixed", "flags", "x y", 0)) == "mixed.flags.'x y'[0]"
    assert dotted(("prefill", "nodes", 0)) == "prefill.nodes[0]"


def test_one_line_escapes_what_a_message_forgot_to_quote() -> None:
    assert one_line("a\nb\x00c\u2028") == "a\\nb\\x00c\\u2028"
    assert one_line("plain 🚀 text") == "plain 🚀 text"
