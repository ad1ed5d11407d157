"""Command-line values: what is accepted, and the one-line error for each thing that is not."""

from __future__ import annotations

import pytest
import typer
from typer.testing import CliRunner

from ucmctl.core.errors import ExitStatus, UcmctlError
from ucmctl.proxy.cli import proxy
from ucmctl.proxy.config import API_KEY_ENV, make_config, normalize_url

P, D = "http://127.0.0.1:7800", "http://127.0.0.1:7801"
PD = {"mode": "pd", "prefillers": [P], "decoders": [D]}
KV = {"mode": "mixed", "instances": [P, D], "routing_name": "kv", "served_model": "m"}


def test_pd_config_from_plan_arguments() -> None:
    cfg = make_config(host="0.0.0.0", port=7802, mode="pd", p2p="ascend", prefillers=[P + "/"], decoders=[D])
    got = (cfg.mode, cfg.p2p, cfg.prefillers, cfg.decoders, cfg.instances)
    assert got == ("pd", "ascend", (P,), (D,), ())
    assert cfg.api_key is None


def test_mixed_config_and_tuning() -> None:
    cfg = make_config(host="h", port=1, mode="mixed", instances=[P, D], retries=0, health_interval=0.5)
    assert cfg.instances == (P, D) and cfg.retries == 0 and cfg.health_interval == 0.5


def test_api_key_only_from_environment() -> None:
    cfg = make_config(host="h", port=1, mode="mixed", instances=[P], env={API_KEY_ENV: "s3cret"})
    assert cfg.api_key == "s3cret"
    assert "s3cret" not in repr(cfg)  # configs get logged; the key must not be


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("http://10.0.0.1:8000", "http://10.0.0.1:8000"),
        ("http://10.0.0.1:8000/", "http://10.0.0.1:8000"),
        ("http://10.0.0.1:8000/v1", "http://10.0.0.1:8000"),
        ("https://node-a:443", "https://node-a"),  # the default port is implied,
    ],
)
def test_url_normalized(url: str, expected: str) -> None:
    assert normalize_url(url, "--decoder") == expected


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"mode": "disagg", "prefillers": [P], "decoders": [D]}, "--mode 'disagg' is not a mode"),
        ({"mode": "pd", "prefillers": [P]}, "pd mode needs at least one --decoder"),
        ({"mode": "pd", "decoders": [D]}, "pd mode needs at least one --prefiller"),
        (
            {"mode": "pd", "prefillers": [P], "decoders": [D], "instances": [P]},
            "--instance is for --mode mixed",
        ),
        ({"mode": "mixed", "instances": [P], "decoders": [D]}, "--prefiller/--decoder are for --mode pd"),
        ({"mode": "mixed", "instances": [P], "p2p": "ascend"}, "--p2p needs --mode pd"),
        ({**PD, "p2p": "nixl"}, "--p2p 'nixl' is not a P2P protocol"),
        ({**PD, "p2p": "mooncake"}, "one --bootstrap per --prefiller (1), got 0"),
        ({**PD, "bootstraps": [D]}, "--bootstrap is for --p2p mooncake"),
        ({"mode": "mixed"}, "mixed mode needs at least one --instance"),
        ({"mode": "mixed", "instances": ["127.0.0.1:7800"]}, "is not an http(s) URL"),
        ({"mode": "mixed", "instances": ["http://h"]}, "has no port"),
        ({"mode": "mixed", "instances": ["http://h:1/x/y"]}, "has a path or query"),
        ({"mode": "mixed", "instances": [P, P + "/"]}, f"--instance {P} is given twice"),
        ({"mode": "mixed", "instances": [P], "port": 70000}, "--port 70000 is out of range"),
        ({"mode": "mixed", "instances": [P], "health_interval": 0}, "--health-interval is 0"),
        ({"mode": "mixed", "instances": [P], "retries": -1}, "--retries is -1"),
        ({"mode": "mixed", "instances": [P], "stall_timeout": -1}, "--stall-timeout is -1"),
        ({"mode": "mixed", "instances": [P], "unhealthy_after": 0}, "--unhealthy-after is 0"),
        ({**KV, "kv_events": [P + "tcp://h:5557"]}, "has no '='"),
        ({**KV, "kv_events": ["http://h:9=tcp://h:5557"]}, "--kv-events http://h:9 is not an instance"),
        ({**KV, "kv_events": [f"{P}=tcp://h"]}, "'tcp://h' is not tcp://HOST:PORT"),
        ({**KV, "kv_events": [f"{P}=ipc:///tmp/x"]}, "is not tcp://HOST:PORT"),
        ({**KV, "kv_events": [f"{P}=tcp://h:1", f"{P}/=tcp://h:2"]}, f"--kv-events {P} is given twice"),
        ({**KV, "routing_name": "session", "kv_events": [f"{P}=tcp://h:1"]}, "which --routing session"),
        ({**KV, "served_model": None, "kv_events": [f"{P}=tcp://h:1"]}, "--kv-events needs --served-model"),
    ],
)
def test_bad_arguments_are_one_line_and_exit_2(kwargs: dict[str, object], needle: str) -> None:
    args: dict[str, object] = {"host": "127.0.0.1", "port": 7802, **kwargs}
    with pytest.raises(UcmctlError) as err:
        make_config(**args)  # type: ignore[arg-type]
    assert err.value.status is ExitStatus.BAD_INPUT
    text = str(err.value)
    assert needle in text and "\n" not in text
    assert "(" in text  # every error says how to fix it


def test_kv_events_name_an_instance_and_a_tcp_endpoint() -> None:
    given = [f"{P}/v1=tcp://10.0.0.1:5557", f"{D}=tcp://[::1]:5558"]
    config = make_config(host="127.0.0.1", port=7802, kv_events=given, **KV)  # type: ignore[arg-type]
    assert config.kv_events == ((P, "tcp://10.0.0.1:5557"), (D, "tcp://[::1]:5558"))
    assert config.served_model == "m"


def test_cli_function_maps_options_to_config(monkeypatch: pytest.MonkeyPatch) -> None:
    seen = {}
    monkeypatch.setattr("ucmctl.proxy.app.run", lambda cfg: seen.setdefault("cfg", cfg))
    monkeypatch.setenv(API_KEY_ENV, "k")
    app = typer.Typer()
    app.command()(proxy)
    argv = ["--host", "0.0.0.0", "--port", "7850", "--mode", "pd", "--p2p", "mooncake", "--prefiller", P]
    argv += ["--prefiller", "http://127.0.0.1:7803", "--decoder", D, "--prefix-affinity"]
    argv += ["--bootstrap", "http://127.0.0.1:8998", "--bootstrap", "http://127.0.0.1:8999"]
    argv += ["--retries", "5", "--deployment", "x"]
    result = CliRunner().invoke(app, argv)
    assert result.exit_code == 0, result.output
    cfg = seen["cfg"]
    assert cfg.prefillers == (P, "http://127.0.0.1:7803") and cfg.decoders == (D,)
    assert cfg.bootstraps == ("http://127.0.0.1:8998", "http://127.0.0.1:8999")
    assert (cfg.port, cfg.p2p, cfg.routing, cfg.retries, cfg.deployment, cfg.api_key) == (
        7850, "mooncake", "affinity", 5, "x", "k",
    )  # fmt: skip
    assert (cfg.load("prefill"), cfg.load("decode"), cfg.load("mixed")) == ("tokens", "requests", "requests")


@pytest.mark.parametrize(
    ("argv", "routing", "loads"),
    [
        ([], "least-loaded", ("tokens", "requests", "requests")),
        (["--routing", "session", "--decode-load", "tokens"], "session", ("tokens", "tokens", "requests")),
        (["--routing", "prefix"], "affinity", ("tokens", "requests", "requests")),  # the topology's old name
        (["--routing", "load", "--prefill-load", "requests"], "least-loaded", ("requests",) * 3),
        (["--routing", "round-robin"], "round-robin", ("tokens", "requests", "requests")),
    ],
)
def test_routing_and_each_legs_load_measure_are_options(
    monkeypatch: pytest.MonkeyPatch, argv: list[str], routing: str, loads: tuple[str, ...]
) -> None:
    seen = {}
    monkeypatch.setattr("ucmctl.proxy.app.run", lambda cfg: seen.setdefault("cfg", cfg))
    app = typer.Typer()
    app.command()(proxy)
    result = CliRunner().invoke(app, ["--prefiller", P, "--decoder", D, *argv])
    assert result.exit_code == 0, result.output
    cfg = seen["cfg"]
    assert cfg.routing == routing
    assert (cfg.load("prefill"), cfg.load("decode"), cfg.load("mixed")) == loads


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"routing_name": "fastest"}, "--routing 'fastest' is not a routing policy"),
        ({"decode_load": "bytes"}, "--decode-load 'bytes' is not a load measure"),
        ({"roles": "any"}, "--roles 'any' is not fixed or dynamic"),
        ({"roles": "dynamic", "p2p": "ascend"}, "--roles dynamic is for pd mode with the store"),
        ({"direct_below": 100, "p2p": "ascend"}, "--direct-below is for pd mode with the store"),
    ],
)
def test_an_unknown_policy_or_load_measure_is_one_line(kwargs: dict[str, object], needle: str) -> None:
    with pytest.raises(UcmctlError) as err:
        make_config(host="127.0.0.1", port=7802, mode="pd", prefillers=[P], decoders=[D], **kwargs)  # type: ignore[arg-type]
    assert needle in str(err.value) and "\n" not in str(err.value)
    assert err.value.status is ExitStatus.BAD_INPUT


def test_main_entry_prints_one_line_and_exits_2() -> None:
    import subprocess
    import sys

    run = subprocess.run(
        [sys.executable, "-m", "ucmctl.proxy", "--mode", "mixed"], capture_output=True, text=True, timeout=60
    )
    assert run.returncode == 2
    assert run.stderr.strip().splitlines() == [
        "error: mixed mode needs at least one --instance (add --instance http://HOST:PORT)"
    ]


def test_ucmctl_proxy_is_the_proxy() -> None:
    import subprocess
    import sys

    cmd = [sys.executable, "-m", "ucmctl", "proxy", "--mode", "mixed"]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert run.returncode == 2 and "mixed mode needs at least one --instance" in run.stderr


def test_accepts_every_proxy_command_line_the_plan_renders(monkeypatch: pytest.MonkeyPatch) -> None:
    from pathlib import Path

    from ucmctl.plan.build import build_plan
    from ucmctl.topology.load import load_topology

    seen: list[object] = []
    monkeypatch.setattr("ucmctl.proxy.app.run", seen.append)  # parse only: nothing listens or connects
    app = typer.Typer()
    app.command()(proxy)
    topologies = sorted((Path(__file__).resolve().parents[3] / "topologies").glob("*.yaml"))
    checked = 0
    for path in topologies:
        plan = build_plan(load_topology(path))
        for proc in (p for p in plan.processes if p.role == "proxy"):
            i = proc.argv.index("proxy")
            assert proc.argv[i - 2 : i] == ["-m", "ucmctl"]
            result = CliRunner().invoke(app, proc.argv[i + 1 :])
            assert result.exit_code == 0, f"{path.name}: {result.output}"
            cfg = seen[-1]
            assert cfg.port == proc.ports["http"]  # type: ignore[attr-defined]
            assert len(cfg.prefillers) + len(cfg.decoders) + len(cfg.instances) >= 1  # type: ignore[attr-defined]
            checked += 1
    assert checked >= 3
