"""`restart: on-failure` on a node whose init is systemd (`systemd: true`): each decode server
runs as a transient systemd unit, which starts it again after a kill -9 during `ucmctl bench`
(the watch reports the loss, then the return, and what it served since came from the store);
status reads the restarts from the unit; after max_restarts kills it stays down and says so;
`down` stops the units (no restart after it) and leaves none. The systemd host is a test host
booted by systemd-nspawn (tests/support/systemd_host.py); the other host has no systemd."""

from __future__ import annotations

import itertools
import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import systemd_host
from tests.support.cli import Cli
from tests.support.netns import Cluster, cluster_or_skip
from tests.support.processes import wait_for
from tests.support.topology import node_lines, write

pytestmark = [pytest.mark.slow, pytest.mark.root]


@pytest.fixture(scope="module")
def systemd_site() -> Iterator[tuple[Cluster, int]]:
    """Two hosts; h2's init is systemd (the container's PID 1 as this machine sees it)."""
    reason = systemd_host.available()
    if reason:
        pytest.skip(f"needs a systemd host: {reason}")
    with cluster_or_skip(2) as c, systemd_host.systemd_init(c, "h2") as pid:
        yield c, pid


def topology(c: Cluster, name: str, *, h1_systemd: bool = False, h2_systemd: bool = True) -> str:
    lines = node_lines(c, ["h1", "h2"]).splitlines()
    for i, (on, host) in enumerate(((h1_systemd, "h1"), (h2_systemd, "h2"))):
        if on:
            assert lines[i].startswith(f"  {host}: {{") and lines[i].endswith("}")
            lines[i] = lines[i][:-1] + ", systemd: true}"
    return f"""
name: {name}
mode: centralized
engine: sim
model: {{path: sim-model}}
nodes:
{chr(10).join(lines)}
storage: {{storage_backends: {c.shared / name}, cache_buffer_capacity_gb: 0.25}}
prefill:
  nodes: [h1]
  port: 8100
  flags: {{block-size: 16, kv-bytes-per-token: 2048}}
decode:
  nodes: [h2]
  servers_per_node: 2
  port: 8200
  flags: {{block-size: 16, kv-bytes-per-token: 2048, decode-step-ms: 25}}
  restart: {{policy: on-failure, max_restarts: 2, backoff_s: 1}}
proxy: {{node: h1, port: 8000}}
"""


def units(pid: int) -> dict[str, str]:
    """ucmctl's units on the systemd host: name -> ActiveState/SubState."""
    listed = systemd_host.inside(
        pid, "systemctl", "list-units", "--all", "--no-legend", "--plain", "ucmctl-*"
    )
    return {w[0]: f"{w[2]}/{w[3]}" for w in (line.split() for line in listed.stdout.splitlines()) if w}


def status_of(cli: Cli, name: str, process: str) -> tuple[str, str]:
    """(its state and health as `status` words them, its restarts column), at 80 columns: the
    state cell may go on in the lines below the row."""
    lines = cli("status", name).stdout.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith(f"{process} "))
    words = lines[at].split()
    below = itertools.takewhile(lambda line: line.startswith(" "), lines[at + 1 :])
    return " ".join(words[4:-2] + [w for line in below for w in line.split()]), words[-1]


def kill_server(c: Cluster, name: str, process: str) -> None:
    """kill -9 of the server's process group, as `bench --fault kill:` sends it."""
    record = json.loads((c.base / "cli-home" / "deployments" / f"{name}.json").read_text())
    plan = next(p for p in record["plan"]["processes"] if p["name"] == process)
    ssh = ["ssh", "-F", str(c.ssh_config), "h2", f"kill -KILL -$(cat {plan['pidfile']})"]
    assert subprocess.run(ssh, capture_output=True, timeout=30).returncode == 0


def test_systemd_restarts_a_killed_decode_until_its_limit_and_down_stops_it_for_good(
    tmp_path: Path, systemd_site: tuple[Cluster, int]
) -> None:
    c, pid = systemd_site
    cli = Cli(c.base / "cli-home", c.ssh_config)
    topo = write(tmp_path, topology(c, "t-sd"))
    plan = cli("plan", str(topo))
    assert "by systemd (a transient unit)" in " ".join(plan.stdout.split()), plan.stdout
    up = cli("up", str(topo), timeout=300)
    assert up.returncode == 0, up.stderr
    assert "set nodes.h2.systemd" not in up.stderr  # it is set
    assert sorted(units(pid).values()) == ["active/running", "active/running"], units(pid)
    assert status_of(cli, "t-sd", "decode-0") == ("running, healthy", "0")

    # kill -9 mid-bench: reported lost, started again by systemd, back in routing, served from the store
    save = tmp_path / "run.json"
    bench = cli("bench", "--prefix-ratio", "0.5", "--input-len", "256", "--output-len", "40",
                "--num-prompts", "60", "--request-rate", "4", "-q", "--fault", "kill:decode-0@5s",
                "--save", str(save), timeout=300)  # fmt: skip
    f = json.loads(save.read_text())["cells"][0]["measure"]["fault"]
    assert f["injected"] and f["was_running"], (f, bench.stderr)
    assert f["detected_after_s"] is not None and f["detected_after_s"] <= 10, f
    assert f["back_after_s"] is not None and f["back_after_s"] <= 15, f
    # the answers it was streaming went on on decode-1 (from the store): none failed
    assert f["failed"] == 0 and f["migrated"] == f["cut_mid_stream"] and f["not_migrated"] == 0, f
    assert f["store_since_back"]["hit_tokens"] > 0, f
    assert status_of(cli, "t-sd", "decode-0") == ("running, restarted 1x, healthy", "1")

    # two more kills: the second restart, then the limit (max_restarts 2): it stays down
    kill_server(c, "t-sd", "decode-0")
    assert wait_for(lambda: status_of(cli, "t-sd", "decode-0") == ("running, restarted 2x, healthy", "2"), 30)
    kill_server(c, "t-sd", "decode-0")
    time.sleep(3)  # past backoff_s: systemd would have started it again by now
    assert status_of(cli, "t-sd", "decode-0") == ("exited (137) after 2 restarts", "2")
    assert status_of(cli, "t-sd", "decode-1") == ("running, healthy", "0")
    log = cli("logs", "t-sd", "decode-0", "-n", "1000").stdout
    assert log.count("INFO sim: serving sim-model") == 3, log  # the first start and 2 restarts

    down = cli("down", "t-sd")
    assert down.returncode == 0, down.stderr
    assert units(pid) == {}  # stopped and forgotten: the failed one too
    time.sleep(2)  # past backoff_s: nothing was started again
    assert c.processes_of("t-sd") == [] and units(pid) == {}


def test_systemd_on_a_node_whose_init_is_not_systemd_is_refused_at_preflight(
    tmp_path: Path, systemd_site: tuple[Cluster, int]
) -> None:
    c, _ = systemd_site
    cli = Cli(tmp_path / "home", c.ssh_config)
    text = topology(c, "t-nosd", h1_systemd=True).replace("prefill:\n", "prefill:\n  restart: on-failure\n")
    up = cli("up", str(write(tmp_path, text)))
    assert up.returncode == 3, up.stderr
    said = " ".join(up.stderr.split())
    assert "systemd cannot restart its processes: systemd is not the node's init" in said, said
    assert "remove nodes.h1.systemd" in said and c.processes_of("t-nosd") == []


def test_a_systemd_host_without_systemd_set_is_named_in_a_warning(
    tmp_path: Path, systemd_site: tuple[Cluster, int]
) -> None:
    c, _ = systemd_site
    cli = Cli(tmp_path / "home", c.ssh_config)
    up = cli("up", str(write(tmp_path, topology(c, "t-warn", h2_systemd=False))), timeout=300)
    try:
        assert up.returncode == 0, up.stderr
        said = " ".join(up.stderr.split())
        assert "systemd is its init: set nodes.h2.systemd: true to have systemd restart" in said, said
    finally:
        assert cli("down", "t-warn").returncode == 0
    assert c.processes_of("t-warn") == []
