"""Every rendered YAML/JSON file reads back as exactly the values the topology gave.

The property: for any text a topology accepts, loading the rendered file (yaml.safe_load for
ucm_config.yaml, json.loads for mooncake.json and the --kv-transfer-config / flag JSON) gives the
identical string; text a topology refuses is refused with one-line messages.
"""

from __future__ import annotations

import io
import json
import math
import os
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from rich.console import Console

from ucmctl.core.errors import UcmctlError
from ucmctl.plan.build import build_plan
from ucmctl.plan.model import Plan, Process
from ucmctl.plan.render import json_value, yaml_value
from ucmctl.plan.show import print_plan
from ucmctl.topology.load import topology_from_source
from ucmctl.topology.source import Source
from ucmctl.topology.text import REFUSED_CATEGORIES, refused_char

# Text YAML might retype or misread when written plain, and text with every kind of quoting trap.
TRICKY = [
    "yes", "no", "on", "off", "null", "~", "true", "1e3", "0x10", "0o17", "1_000", ".inf", "-.nan",
    "2001-12-14", "12:30:00", "- a", "* b", "&anchor", "*alias", "!tag", "!!str", "%YAML", "@at",
    "`tick", "? key", "| block", "> fold", "# not a comment", "a #b", "key: value", "a:b", "{x}", "[y]",
    "'single'", '"double"', "back\\slash", "\\n not a newline", "\\ud83d\\ude80", " lead", "trail ",
    "rocket 🚀", "e\u0301", "👩\u200d👩\u200d👧", "\ufeffbom", "\u00a0nbsp", "\ufffe", "\U0010fffd", "ß∂ƒ",
]  # fmt: skip
ACCEPTED = st.characters(exclude_categories=tuple(REFUSED_CATEGORIES))  # type: ignore[arg-type]
ANY_TEXT = st.text(min_size=1, max_size=40)
SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _topology(value: str, backend: str, *, p2p: bool) -> dict[str, Any]:
    """Ascend P2P writes mooncake.json (device_name) and a ucm_config.yaml for prefill."""
    data: dict[str, Any] = {
        "name": "roundtrip",
        "mode": "p2p" if p2p else "mixed",
        "model": {"path": "/models/" + value, "served_name": "m " + value},
        "nodes": {
            "a": {"host": "10.0.0.1", "platform": "ascend", "devices": 8, "env": {"X": value}},
            "b": {"host": "10.0.0.2", "platform": "ascend", "devices": 8},
        },
        "storage": {"storage_backends": [backend, "/mnt/second"], "cache_buffer_capacity_gb": 1.5},
    }
    flags = {"chat-template": value, "override-generation-config": {value: [value, 1]}}
    if p2p:
        data["mooncake"] = {"master_node": "a", "device_name": value}
        data["prefill"] = {"nodes": ["a"], "flags": flags}
        data["decode"] = {"nodes": ["b"]}
        data["proxy"] = {"node": "a"}
    else:
        data["nodes"].pop("b")
        data["mixed"] = {"nodes": ["a"], "flags": flags}
    return data


def _plan(data: dict[str, Any]) -> Plan:
    return build_plan(topology_from_source(Source("<test>", data)))


def _file(process: Process, name: str) -> str:
    return next(f.content for f in process.files if f.path.endswith("/" + name))


def _argument(process: Process, flag: str) -> str:
    return process.argv[process.argv.index(flag) + 1]


def _assert_round_trip(plan: Plan, value: str, backend: str, *, p2p: bool) -> None:
    server = plan.process("prefill-0" if p2p else "mixed-0")
    ucm = yaml.safe_load(_file(server, "ucm_config.yaml").encode("utf-8"))  # the bytes on the node
    store = ucm["ucm_connectors"][0]["ucm_connector_config"]
    assert store["storage_backends"].split(":") == [backend, "/mnt/second"]
    assert store["cache_buffer_capacity_gb"] == 1.5
    assert store["store_pipeline"] == "Cache|Posix"
    assert _argument(server, "--chat-template") == value
    assert json.loads(_argument(server, "--override-generation-config")) == {value: [value, 1]}
    assert server.argv[server.argv.index("serve") + 1] == "/models/" + value
    assert _argument(server, "--served-model-name") == "m " + value
    assert server.env["X"] == value
    kv = json.loads(_argument(server, "--kv-transfer-config"))
    assert kv is not None
    if p2p:
        mooncake = json.loads(_file(server, "mooncake.json").encode("utf-8"))
        assert mooncake["device_name"] == value


def _should_refuse(value: str, backend: str) -> bool:
    """What the topology rules refuse for these fields; everything else must be accepted."""
    return (
        refused_char(value + backend) is not None
        or ":" in backend  # the separator of storage_backends in ucm_config.yaml
        or "/../" in backend + "/"
        or backend == "/mnt/second"  # listed twice
    )


def _accepted_or_refused_on_one_line(value: str, backend: str, *, p2p: bool) -> None:
    try:
        plan = _plan(_topology(value, backend, p2p=p2p))
    except UcmctlError as exc:
        rendered = [p.render() for p in exc.problems]
        assert all(refused_char(r) is None for r in rendered), rendered
        assert _should_refuse(value, backend), f"plain text refused: {rendered}"
        return
    assert not _should_refuse(value, backend), "text the rules refuse was accepted"
    _assert_round_trip(plan, value, backend, p2p=p2p)


@pytest.mark.parametrize("value", TRICKY)
@pytest.mark.parametrize("p2p", [False, True], ids=["mixed", "p2p"])
def test_tricky_text_is_accepted_and_reads_back_identically(value: str, p2p: bool) -> None:
    backend = "/mnt/" + value.replace(":", "_").replace("/", "_")
    plan = _plan(_topology(value, backend, p2p=p2p))  # accepted: none of these is refused
    _assert_round_trip(plan, value, backend, p2p=p2p)


@SETTINGS
@given(value=st.text(ACCEPTED, min_size=1, max_size=40), backend=st.text(ACCEPTED, min_size=1, max_size=20))
@example(value="🚀", backend="🚀")
@example(value="a\u2028b", backend="x")
def test_any_accepted_text_reads_back_identically(value: str, backend: str) -> None:
    _accepted_or_refused_on_one_line(value, "/mnt/" + backend, p2p=True)


@SETTINGS
@given(value=ANY_TEXT, backend=ANY_TEXT)
@example(value="a\nb", backend="x")
@example(value="m\x00", backend="\ud83d")
def test_any_text_is_accepted_exactly_or_refused_on_one_line(value: str, backend: str) -> None:
    _accepted_or_refused_on_one_line(value, "/mnt/" + backend, p2p=False)


@SETTINGS
@given(st.text(max_size=60))  # control characters too: the renderer must escape what it is given
@example("\\ud83d\\ude80")
@example("\x00\x85\u2028\ufeff\t\r\n\x7f")
def test_yaml_scalar_reads_back_as_the_same_text(text: str) -> None:
    rendered = yaml_value(text)
    assert "\n" not in rendered
    assert yaml.safe_load(f"key: {rendered}\n".encode()) == {"key": text}


@SETTINGS
@given(st.one_of(st.floats(allow_nan=False, allow_infinity=False), st.integers(), st.booleans()))
@example(1e-05)
@example(1e20)
def test_yaml_numbers_read_back_as_the_same_number(number: float | int | bool) -> None:
    loaded = yaml.safe_load(f"key: {yaml_value(number)}\n")["key"]
    assert loaded == number and isinstance(loaded, bool) == isinstance(number, bool)


@SETTINGS
@given(
    st.recursive(
        st.text(ACCEPTED) | st.integers() | st.booleans(),
        lambda c: st.lists(c) | st.dictionaries(st.text(ACCEPTED), c),
    )
)
def test_json_value_reads_back_as_the_same_value(value: Any) -> None:
    rendered = json_value(value)
    assert "\n" not in rendered
    assert json.loads(rendered.encode("utf-8")) == value


@pytest.mark.parametrize("bad", [math.inf, math.nan])
def test_numbers_without_a_portable_form_are_refused_by_the_renderer(bad: float) -> None:
    with pytest.raises(ValueError):
        yaml_value(bad)


def test_lone_surrogate_is_refused_by_the_renderer() -> None:
    with pytest.raises(ValueError):
        yaml_value("\ud83d")
    with pytest.raises(UnicodeEncodeError):
        json_value({"k": "\udc80"})


def test_rendered_script_passes_unicode_unchanged(tmp_path: Path) -> None:
    """launch.sh: the shell hands the process the exact argv and environment."""
    value = "rocket 🚀 e\u0301 'q\" \\ # yes"
    data = _topology(value, "/mnt/🚀", p2p=False)
    data["nodes"]["a"] |= {"host": "127.0.0.1", "transport": "local", "platform": "cpu"}
    data["nodes"]["a"]["workdir"] = str(tmp_path / "wörk 🚀")
    server = _plan(data).process("mixed-0")
    for f in server.files:
        Path(f.path).parent.mkdir(parents=True, exist_ok=True)
        Path(f.path).write_bytes(f.content.encode("utf-8"))
    # a stand-in `vllm` that reports the argv and environment it was given
    fake = tmp_path / "vllm"
    fake.write_text(
        f"#!{sys.executable}\nimport json, os, sys\nprint(json.dumps([sys.argv[1:], os.environ['X']]))\n"
    )
    fake.chmod(0o755)
    env = {**os.environ, "PATH": f"{tmp_path}:{os.environ['PATH']}", "LC_ALL": "C"}
    run = subprocess.run(["sh", server.launch], capture_output=True, env=env, check=True)
    argv, x = json.loads(run.stdout)
    assert argv == server.argv[1:] and x == value


def test_printed_plan_shows_values_as_written() -> None:
    """`ucmctl plan` output: rich must not turn `:smile:` into an emoji or `[b]` into markup."""
    value = ":smile: [b]x[/b] 🚀"
    out = io.StringIO()
    print_plan(_plan(_topology(value, "/mnt/x", p2p=False)), Console(file=out, width=400))
    assert f"env X={shlex.quote(value)}" in out.getvalue()
    assert f"--chat-template {shlex.quote(value)}" in out.getvalue()
