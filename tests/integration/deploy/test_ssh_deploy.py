"""`ucmctl up / status / logs / down` over real SSH to network-namespace hosts, on the simulator
(and the real Mooncake master): what runs, what fails, and that nothing is left behind."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from tests.support import gluster
from tests.support.cli import Cli
from tests.support.http import completion, metrics
from tests.support.netns import Cluster
from tests.support.processes import wait_for
from tests.support.topology import mixed_sim, node_lines, write

pytestmark = [pytest.mark.slow, pytest.mark.root]
SHARES = "gluster"  # glusterd: one module at a time (tests/support/fixtures.py)


def centralized(c: Cluster, name: str, *, extra_side: str = "", backend: Path | None = None) -> str:
    return f"""
name: {name}
mode: centralized
engine: sim
model: {{path: sim-model}}
nodes:
{node_lines(c, ["h1", "h2"])}
storage: {{storage_backends: {backend or c.shared / name}, cache_buffer_capacity_gb: 0.25}}
prefill:
  nodes: [h1]
  servers_per_node: 2
  port: 8100
  flags: {{block-size: 16, kv-bytes-per-token: 2048}}
{extra_side}
decode:
  nodes: [h2]
  servers_per_node: 2
  port: 8200
  flags: {{block-size: 16, kv-bytes-per-token: 2048}}
proxy: {{node: h1, port: 8000}}
"""


def decode_hits_after_a_prefix(hosts: Cluster) -> float:
    """A 160-token prompt (10 blocks of 16) through the proxy of `centralized(...)`, then three that
    extend it: the decode servers' external prefix hits (their prefix came from the shared store,
    written by the prefill side)."""
    proxy = f"http://{hosts.host('h1').address}:8000"
    prompt = list(range(1, 161))
    first = completion(proxy, prompt)
    assert first["usage"]["prompt_tokens"] == 160 and first["usage"]["completion_tokens"] == 4
    for _ in range(3):
        completion(proxy, [*prompt, 9, 9])
    decoders = [f"http://{hosts.host('h2').address}:{p}" for p in (8200, 8201)]
    return sum(float(line.rsplit(" ", 1)[1]) for d in decoders for line in metrics(d).splitlines()
               if line.startswith("vllm:external_prefix_cache_hits_total"))  # fmt: skip


def test_2p2d_centralized_end_to_end(tmp_path: Path, hosts: Cluster, cli: Cli) -> None:
    topo = write(tmp_path, centralized(hosts, "t-2p2d"))
    up = cli("up", str(topo))
    assert up.returncode == 0, up.stderr
    assert "deployment t-2p2d is up: 5 processes" in up.stdout
    assert list((hosts.shared / "t-2p2d").glob(".ucmctl-shared-check-*")) == []  # preflight tidied up

    # The health gates' watch loops end with their channels (at their next heartbeat, <= 1 s).
    def watch_loops() -> list[str]:
        return [c for c in hosts.commands_mentioning("/t-2p2d/") if "members()" in c]

    deadline = time.monotonic() + 5
    while watch_loops() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert watch_loops() == []
    assert decode_hits_after_a_prefix(hosts) > 0
    status = cli("status", "t-2p2d")
    assert status.returncode == 0 and len(re.findall(r"\bhealthy\b", status.stdout)) == 5
    assert "unhealthy" not in status.stdout
    logs = cli("logs", "t-2p2d", "decode-1", "-n", "5")
    assert logs.returncode == 0 and "decode-1@h2 | " in logs.stdout
    assert len(hosts.processes_of("t-2p2d")) >= 5
    pids = sorted(hosts.processes_of("t-2p2d"))
    twice = cli("up", str(topo))  # the same topology again: nothing to start, nothing restarted
    assert twice.returncode == 0 and "already up with this topology: nothing to change" in twice.stderr
    assert sorted(hosts.processes_of("t-2p2d")) == pids
    # edited: one decode instance on each host; each moves in turn (drained, stopped, started on
    # its new host and port, routed there), the prefill side and the proxy keep running
    one_each = "decode:\n  nodes: [h1, h2]\n  servers_per_node: 1"
    moved = write(
        tmp_path,
        centralized(hosts, "t-2p2d").replace("decode:\n  nodes: [h2]\n  servers_per_node: 2", one_each),
    )
    changed = cli("up", str(moved))
    assert changed.returncode == 0, changed.stderr
    assert "this topology will restart decode-0, decode-1 (the rest stays running)" in changed.stderr
    assert re.search(r"^decode-0 on h1: restarted in", changed.stderr, re.MULTILINE), changed.stderr
    record = json.loads((tmp_path / "home" / "deployments" / "t-2p2d.json").read_text())
    urls = {p["name"]: p["url"] for p in record["plan"]["processes"]}
    h1, h2 = hosts.host("h1").address, hosts.host("h2").address
    assert (urls["decode-0"], urls["decode-1"]) == (f"http://{h1}:8200", f"http://{h2}:8200"), urls
    routed = json.loads(urllib.request.urlopen(f"http://{h1}:8000/instances").read())["instances"]
    assert sorted(i["url"] for i in routed if i["role"] == "decode") == [
        f"http://{h1}:8200",
        f"http://{h2}:8200",
    ]
    assert completion(f"http://{h1}:8000", list(range(1, 161)))["usage"]["completion_tokens"] == 4
    kept = [p for p in pids if p in hosts.processes_of("t-2p2d")]
    assert len(kept) >= 3  # the prefill servers' and the proxy's processes
    down = cli("down", "t-2p2d")
    assert down.returncode == 0 and "5 processes stopped" in down.stdout
    assert hosts.processes_of("t-2p2d") == []


def test_2p2d_centralized_over_a_glusterfs_volume(tmp_path: Path, hosts: Cluster, cli: Cli) -> None:
    """The store's backend a real network filesystem: served from h3, mounted by h1's and h2's
    own clients; the decode side reads through h2's client what the prefill side wrote through h1's."""
    if reason := gluster.available():
        pytest.skip(reason)
    with gluster.gluster_volume(hosts, "t2p2d", server="h3", clients=["h1", "h2"]) as vol:
        topo = write(tmp_path, centralized(hosts, "t-gluster", backend=vol.mount / "kv"))
        up = cli("up", str(topo))
        assert up.returncode == 0, up.stderr
        # preflight names the filesystem on each node; coherent mounts: no warning of staleness,
        # one line for the backend's file per block (storage.pack_blocks left at 1), with the fix
        assert f"storage {vol.mount / 'kv'}: fuse.glusterfs on h1, h2; O_DIRECT: yes" in up.stderr, up.stderr
        warned = [line for line in up.stderr.splitlines() if "warning" in line]
        assert len(warned) == 1, up.stderr
        assert warned[0].startswith(f"warning: storage backend {vol.mount / 'kv'} is on GlusterFS with")
        assert "set storage.pack_blocks so a pack holds 16-64 MiB" in warned[0]
        assert decode_hits_after_a_prefix(hosts) > 0
        blocks = [f for f in (vol.brick / "kv").rglob("*") if f.is_file() and ".ucmctl-shared" not in f.name]
        assert len(blocks) >= 10, blocks  # on the server's brick, through the network
        assert not (vol.mount / "kv").exists()  # nothing on this machine's own disk at that path
        down = cli("down", "t-gluster")
        assert down.returncode == 0, down.stderr
        assert hosts.processes_of("t-gluster") == []
        # h2's client with GlusterFS's default caching: up warns, in one line naming it and the fix
        vol.unmount_on("h2")
        vol.coherent = False
        vol.mount_on("h2")
        cached = cli("up", str(topo))
        assert cached.returncode == 0, cached.stderr
        warned = [line for line in cached.stderr.splitlines() if line.startswith("warning: node")]
        assert len(warned) == 1 and "node h2:" in warned[0] and "entry-timeout 1 s" in warned[0], warned
        assert "entry-timeout=0,attribute-timeout=0,negative-timeout=0" in warned[0]
        assert cli("down", "t-gluster").returncode == 0
        # the volume's quick-read cache turned on: read from the clients' own graphs, both warned
        vol.gluster("volume", "set", vol.name, "performance.quick-read", "on")
        quick = "with performance.quick-read on"
        graphs = f"{vol.mount}/.meta/graphs/active"
        assert wait_for(lambda: all("quick-read" in vol.on(h, "ls", graphs).stdout for h in ("h1", "h2")))
        again = cli("up", str(topo))
        assert again.returncode == 0, again.stderr
        warned = [line for line in again.stderr.splitlines() if line.startswith("warning") and quick in line]
        assert [w.split(":")[1] for w in warned] == [" node h1", " node h2"], again.stderr
        assert f"gluster volume set {vol.name} performance.quick-read off" in warned[0]
        assert cli("down", "t-gluster").returncode == 0


def test_xpyd_across_four_hosts(tmp_path: Path, hosts: Cluster, cli: Cli) -> None:
    topo = write(
        tmp_path,
        f"""
name: t-xpyd
mode: centralized
engine: sim
model: {{path: sim-model}}
nodes:
{node_lines(hosts, ["h1", "h2", "h3", "h4"])}
storage: {{storage_backends: {hosts.shared / "xpyd"}, cache_buffer_capacity_gb: 0.25}}
prefill:
  nodes: [h1, h2, h3]
  servers_per_node: {{h1: 2, h2: 1, h3: 1}}
  port: 8100
  flags: {{block-size: 16}}
decode:
  nodes: [h3, h4]
  port: 8200
  flags: {{block-size: 16}}
proxy: {{node: h4, port: 8000}}
""",
    )
    up = cli("up", str(topo))
    assert up.returncode == 0, up.stderr
    proxy = f"http://{hosts.host('h4').address}:8000"
    for i in range(8):
        body = completion(proxy, [i + 1] * 40)
        assert body["usage"]["completion_tokens"] == 4
    assert {h for h, _ in hosts.processes_of("t-xpyd")} == {"h1", "h2", "h3", "h4"}
    assert cli("down", str(topo)).returncode == 0
    assert hosts.processes_of("t-xpyd") == []


def test_p2p_with_the_real_mooncake_master(tmp_path: Path, hosts: Cluster, cli: Cli) -> None:
    import shutil
    import sys

    master = Path(sys.executable).parent / "mooncake_master"
    if not master.exists() and shutil.which("mooncake_master") is None:
        pytest.fail("mooncake_master is missing: scripts/setup.sh --tests installs mooncake-transfer-engine")
    topo = write(
        tmp_path,
        f"""
name: t-p2p
mode: p2p
engine: sim
model: {{path: sim-model}}
nodes:
{node_lines(hosts, ["h1", "h2"])}
storage: {{storage_backends: {hosts.shared / "p2p"}, cache_buffer_capacity_gb: 0.25}}
mooncake: {{master_node: h1, protocol: tcp}}
prefill: {{nodes: [h1], port: 9000, flags: {{block-size: 16}}}}
decode: {{nodes: [h2], port: 9000, flags: {{block-size: 16}}}}
proxy: {{node: h1, port: 7850}}
""",
    )
    up = cli("up", str(topo))
    assert up.returncode == 0, up.stderr
    # the KV probe's request moved 1099 of its 1100 tokens (the simulator computes the last one)
    assert "KV probe: p2p: decode's KV-transfer tokens grew by 1099 for a 1100-token probe" in up.stderr
    addr = hosts.host("h1").address
    assert "master_" in metrics(f"http://{addr}:9003")  # the real master answers on its metrics port

    def transferred() -> float:
        decode = metrics(f"http://{hosts.host('h2').address}:9000")
        name = "vllm:prompt_tokens_by_source_total"
        return sum(float(x.rsplit(" ", 1)[1]) for x in decode.splitlines()
                   if x.startswith(name) and "external_kv_transfer" in x)  # fmt: skip

    before = transferred()
    body = completion(f"http://{addr}:7850", list(range(1, 100)))
    assert body["usage"]["completion_tokens"] == 4
    # Decode pulled the prompt's KV from the prefiller (transfer_id, engine from its bootstrap server).
    assert transferred() - before == 98
    status = cli("status", "t-p2p")
    assert "KV probe passed" in status.stdout
    assert cli("down", "t-p2p").returncode == 0
    assert hosts.processes_of("t-p2p") == []


def test_up_fails_when_kv_does_not_reach_decode(tmp_path: Path, hosts: Cluster, cli: Cli) -> None:
    """Broken on purpose: a store folder that is not shared (each host has its own `private`),
    with the preflight that would catch it skipped. Every server is healthy; decode recomputes."""
    topo = write(tmp_path, centralized(hosts, "t-probe", backend=hosts.private / "not-shared"))
    up = cli("up", str(topo), "--skip-preflight")
    assert up.returncode == 1, up.stderr
    line = ("error: KV probe: centralized: decode found nothing prefill stored "
            "(vllm:external_prefix_cache_hits_total did not grow for a 1100-token probe)")  # fmt: skip
    assert line in up.stderr
    assert "is up" not in up.stdout
    assert hosts.processes_of("t-probe") == []  # stopped everything it started

    kept = cli("up", str(topo), "--skip-preflight", "--keep-on-failure")
    assert kept.returncode == 1
    status = cli("status", "t-probe")
    assert "KV probe FAILED" in status.stdout and "failed" in status.stdout
    assert cli("down", "t-probe").returncode == 0
    assert hosts.processes_of("t-probe") == []

    opted_out = cli("up", str(topo), "--skip-preflight", "--skip-kv-probe")
    assert opted_out.returncode == 0 and "KV probe" not in opted_out.stderr
    assert cli("down", "t-probe").returncode == 0


def test_unreachable_node_fails_preflight_fast(tmp_path: Path, hosts: Cluster, cli: Cli) -> None:
    nowhere = hosts.unused_address
    topo = write(tmp_path, centralized(hosts, "t-unreach").replace(hosts.host("h2").address, nowhere))
    started = time.monotonic()
    up = cli("up", str(topo))
    assert up.returncode == 3, up.stderr
    assert f"node h2 ({nowhere}): unreachable" in up.stderr
    assert time.monotonic() - started < 40  # within the 10 s connect timeout, plus start-up
    assert hosts.processes_of("t-unreach") == []


def test_a_host_name_the_node_cannot_resolve_needs_bind(tmp_path: Path, hosts: Cluster, cli: Cli) -> None:
    """Listeners bind the node's address, never every interface by default: a host given by a
    name (an SSH config alias here) that the node itself cannot resolve is caught before start."""
    address = hosts.host("h3").address
    text = mixed_sim("t-bind", node_lines(hosts, ["h3"]).replace(f"host: {address}", "host: h3"), "h3", 8500)
    up = cli("up", str(write(tmp_path, text)))
    assert up.returncode == 3, up.stderr
    assert "node h3 (h3): host 'h3' does not resolve on the node: set nodes.h3.bind to its IP" in up.stderr
    bound = text.replace("host: h3,", f"host: h3, bind: {address},")
    assert bound != text
    up = cli("up", str(write(tmp_path, bound)))
    assert up.returncode == 0, up.stderr
    listening = subprocess.run(["ip", "netns", "exec", hosts.host("h3").netns, "ss", "-ltnH"],
                               capture_output=True, text=True).stdout  # fmt: skip
    assert f"{address}:8500" in listening and "0.0.0.0:8500" not in listening, listening
    assert cli("down", "t-bind").returncode == 0


def test_storage_that_is_not_shared_fails_preflight(tmp_path: Path, hosts: Cluster, cli: Cli) -> None:
    topo = write(tmp_path, centralized(hosts, "t-private", backend=hosts.private / "store"))
    up = cli("up", str(topo))
    assert up.returncode == 3
    assert (
        f"node h2: storage backend {hosts.private / 'store'} is not the filesystem node h1 wrote to"
        in up.stderr
    )
    assert hosts.processes_of("t-private") == []
    assert list((hosts.base / "h1" / "private" / "store").glob(".ucmctl-shared-check-*")) == []  # tidied


def test_unwritable_storage_fails_preflight_with_the_reason(tmp_path: Path, hosts: Cluster, cli: Cli) -> None:
    topo = write(tmp_path, centralized(hosts, "t-nostore", backend=Path("/proc/ucmctl-no-store")))
    up = cli("up", str(topo))
    assert up.returncode == 3
    assert "node h1: cannot write to storage backend /proc/ucmctl-no-store: mkdir: " in up.stderr
    assert "No such file or directory" in up.stderr
    assert hosts.processes_of("t-nostore") == []


def test_a_server_that_dies_during_start_fails_up_and_leaves_nothing(
    tmp_path: Path, hosts: Cluster, cli: Cli
) -> None:
    text = centralized(hosts, "t-dies").replace(
        "  port: 8200\n  flags: {block-size: 16, kv-bytes-per-token: 2048}",
        "  port: 8200\n  flags: {block-size: 16, max-num-seqs: 0}",  # the simulator refuses and exits
    )
    up = cli("up", str(write(tmp_path, text)))
    assert up.returncode == 1
    assert "failed: the process exited before it became healthy" in up.stderr
    assert "--max-num-seqs must be at least 1" in up.stderr  # its log tail is shown
    assert "stopped everything this `up` started" in up.stderr
    assert hosts.processes_of("t-dies") == []
    assert cli("status", "t-dies").returncode == 2  # no record left behind


def test_down_finds_processes_after_the_local_record_is_lost(
    tmp_path: Path, hosts: Cluster, cli: Cli
) -> None:
    topo = write(tmp_path, centralized(hosts, "t-lost"))
    assert cli("up", str(topo)).returncode == 0
    record = tmp_path / "home" / "deployments" / "t-lost.json"
    record.unlink()
    assert cli("down", "t-lost").returncode == 2  # by name it is unknown now ...
    again = cli("up", str(topo))  # ... and a new `up` sees the old run on the nodes
    assert again.returncode == 3 and "already runs on the nodes" in again.stderr
    down = cli("down", str(topo))  # ... but the topology leads to the run directories
    assert down.returncode == 0 and "5 processes stopped" in down.stdout
    assert hosts.processes_of("t-lost") == []


def test_ups_from_two_control_machines_start_the_deployment_once(tmp_path: Path, hosts: Cluster) -> None:
    """Two machines (own records) run `up` of one topology at once: the nodes' lock, held over
    each one's SSH channel, lets one through; the other says who holds it and touches nothing."""
    topo = write(tmp_path, centralized(hosts, "t-twice"))
    clis = [Cli(tmp_path / f"home{i}", hosts.ssh_config) for i in range(2)]
    racers = [subprocess.Popen([sys.executable, "-m", "ucmctl", "up", str(topo)], env=c.env, text=True,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE) for c in clis]  # fmt: skip
    results = [(p.wait(timeout=300), p.communicate()[1]) for p in racers]
    assert sorted(code for code, _ in results) in ([0, 3], [0, 4]), results
    loser = next(err for code, err in results if code != 0)
    errors = [line for line in loser.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and (
        "'t-twice' is being started on node h" in errors[0] or "already runs on the nodes" in errors[0]
    ), loser
    assert len(hosts.processes_of("t-twice")) >= 5
    winner = clis[[code for code, _ in results].index(0)]
    down = winner("down", "t-twice")
    assert down.returncode == 0 and "5 processes stopped" in down.stdout
    assert hosts.processes_of("t-twice") == []
    assert hosts.commands_mentioning("flock -n 9") == []  # the nodes' lock loops ended with `up`


def test_shell_metacharacters_in_the_topology_are_harmless(tmp_path: Path, hosts: Cluster, cli: Cli) -> None:
    evil = "sim model $(touch /var/tmp/ucmctl-pwned) `id` ; echo pwned"
    text = f"""
name: t-quote
mode: mixed
engine: sim
model: {{path: {json.dumps(evil)}}}
nodes:
{node_lines(hosts, ["h3"])}
mixed:
  nodes: [h3]
  port: 8300
  env: {{EVIL: "$(touch /var/tmp/ucmctl-pwned2)"}}
"""
    up = cli("up", str(write(tmp_path, text)))
    assert up.returncode == 0, up.stderr
    with urllib.request.urlopen(f"http://{hosts.host('h3').address}:8300/v1/models", timeout=10) as r:
        assert json.loads(r.read())["data"][0]["id"] == evil
    assert cli("down", "t-quote").returncode == 0
    assert not Path("/var/tmp/ucmctl-pwned").exists() and not Path("/var/tmp/ucmctl-pwned2").exists()
    assert hosts.processes_of("t-quote") == []


def test_install_pushes_a_wheel_to_every_node(tmp_path: Path, hosts: Cluster, cli: Cli) -> None:
    import subprocess
    import sys
    import zipfile

    # A minimal wheel, written by hand (a wheel is a zip with METADATA, WHEEL and RECORD).
    wheel = tmp_path / "ucmdummy-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        z.writestr("ucmdummy/__init__.py", "VALUE = 42\n")
        z.writestr("ucmdummy-1.0.dist-info/METADATA", "Metadata-Version: 2.1\nName: ucmdummy\nVersion: 1.0\n")
        wheel_info = "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        z.writestr("ucmdummy-1.0.dist-info/WHEEL", wheel_info)
        z.writestr("ucmdummy-1.0.dist-info/RECORD", "")
    venv = hosts.shared / "install-venv"
    subprocess.run(
        [sys.executable, "-m", "venv", "--without-pip", "--system-site-packages", str(venv)], check=True
    )
    text = f"""
name: t-install
mode: mixed
engine: sim
model: {{path: sim-model}}
nodes:
  h1: {{host: {hosts.host("h1").address}, key: {hosts.key}, platform: cpu, venv: {venv}}}
  h2: {{host: {hosts.host("h2").address}, key: {hosts.key}, platform: cpu, venv: {venv}}}
mixed: {{nodes: [h1, h2], port: 8400}}
"""
    done = cli("install", str(write(tmp_path, text)), "--wheel", str(wheel), "--no-deps")
    assert done.returncode == 0, done.stderr
    assert "h1: installed ucmdummy-1.0-py3-none-any.whl" in done.stdout
    assert "h2: installed ucmdummy-1.0-py3-none-any.whl" in done.stdout
    check = hosts.run("h2", str(venv / "bin" / "python"), "-c", "import ucmdummy; print(ucmdummy.VALUE)")
    assert check.stdout.strip() == "42"
    bad = cli("install", str(write(tmp_path, text)), "--wheel", str(tmp_path / "nope.whl"))
    assert bad.returncode == 2 and "is not a wheel file" in bad.stderr


def test_purge_storage_removes_only_the_stores_folders(tmp_path: Path, hosts: Cluster, cli: Cli) -> None:
    backend = hosts.shared / "t-purge"
    topo = write(tmp_path, centralized(hosts, "t-purge", backend=backend))
    assert cli("up", str(topo)).returncode == 0
    completion(f"http://{hosts.host('h1').address}:8000", list(range(1, 161)))
    deadline = time.monotonic() + 10
    while not list(backend.glob("[0-9a-f][0-9a-f][0-9a-f]")) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert list(backend.glob("[0-9a-f][0-9a-f][0-9a-f]"))
    (backend / "keep-me.txt").write_text("not the store's")
    down = cli("down", str(topo), "--purge-storage", "--yes")
    assert down.returncode == 0, down.stderr
    assert "purged" in down.stdout
    assert not list(backend.glob("[0-9a-f][0-9a-f][0-9a-f]"))
    assert (backend / "keep-me.txt").read_text() == "not the store's"
    assert hosts.processes_of("t-purge") == []


def test_prometheus_scrapes_every_target_and_every_dashboard_panel_has_data(
    tmp_path: Path, hosts: Cluster, cli: Cli
) -> None:
    """`render NAME --prometheus DIR` of a running 2P2D on the test hosts, then Debian's real
    Prometheus with that folder: promtool passes the config and the rules, every target is up
    with its labels, the rules load, and every dashboard panel's query returns data (Grafana
    itself cannot run here: its panels are checked through their queries)."""
    import os
    import shutil
    import socket
    import urllib.parse

    from ucmctl.monitor.dashboards import PANELS

    assert shutil.which("prometheus") and shutil.which("promtool"), "setup.sh --tests installs prometheus"
    topo = write(tmp_path, centralized(hosts, "t-prom"))
    assert cli("up", str(topo)).returncode == 0
    folder = tmp_path / "prom"
    rendered = cli("render", "t-prom", "--prometheus", str(folder), "--scrape-interval", "1")
    assert rendered.returncode == 0, rendered.stderr
    for check in (["check", "config", "prometheus.yml"], ["check", "rules", "ucmctl-t-prom-alerts.yml"]):
        done = subprocess.run(["promtool", *check], cwd=folder, capture_output=True, text=True)
        assert done.returncode == 0, done.stdout + done.stderr
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    api = f"http://127.0.0.1:{port}/api/v1"
    server = subprocess.Popen(
        ["prometheus", f"--config.file={folder / 'prometheus.yml'}",
         f"--storage.tsdb.path={tmp_path / 'tsdb'}", f"--web.listen-address=127.0.0.1:{port}"],
        stdout=subprocess.DEVNULL, stderr=(tmp_path / "prometheus.log").open("w"), env=dict(os.environ),
    )  # fmt: skip

    def get(path: str) -> dict:
        return json.loads(urllib.request.urlopen(f"{api}/{path}", timeout=10).read())

    def targets() -> list[dict]:
        try:
            return get("targets")["data"]["activeTargets"]
        except OSError:
            return []

    try:
        all_up = lambda: len(targets()) == 5 and all(t["health"] == "up" for t in targets())  # noqa: E731
        assert wait_for(all_up, timeout=60), (targets(), (tmp_path / "prometheus.log").read_text()[-2000:])
        labelled = sorted(
            (t["labels"]["process"], t["labels"]["role"], t["labels"]["node"]) for t in targets()
        )
        assert labelled == [("decode-0", "decode", "h2"), ("decode-1", "decode", "h2"),
                            ("prefill-0", "prefill", "h1"), ("prefill-1", "prefill", "h1"),
                            ("proxy", "proxy", "h1")]  # fmt: skip
        assert {t["labels"]["deployment"] for t in targets()} == {"t-prom"}
        bench = cli(
            "bench", "--input-len", "256", "--output-len", "8", "--num-prompts", "16", "--reset-hbm", "-q"
        )
        assert bench.returncode == 0, bench.stderr
        time.sleep(3)  # a few scrapes after the load
        groups = get("rules")["data"]["groups"]
        assert [r["name"] for g in groups for r in g["rules"]] == [
            "UcmctlTargetDown",
            "UcmctlDecodePreempting",
            "UcmctlExternalHitRateCollapsed",
            "UcmctlStoreErrors",
            "UcmctlProxyUpstreamErrors",
        ]
        health = {r["name"]: (r["health"], r.get("lastError")) for g in groups for r in g["rules"]}
        assert {h for h, _ in health.values()} == {"ok"}, health
        empty, quiet = [], []
        for panel in PANELS:
            answers = []
            for legend, expr in panel.queries:
                query = urllib.parse.quote(expr.replace("$deployment", "t-prom"))
                answer = get(f"query?query={query}")
                assert answer["status"] == "success", (panel.title, expr, answer)
                answers.append(answer["data"]["result"])
                if not answer["data"]["result"]:
                    quiet.append(legend.split(" {{")[0])
            if not any(answers):
                empty.append(panel.title)
        assert empty == [], empty
        # only what had nothing to count: no retry, no error, no Mooncake master in this layout
        assert sorted(quiet) == ["before the first token", "errors", "master up", "retries"], quiet
    finally:
        server.terminate()
        server.wait(timeout=30)
        cli("down", "t-prom")
    assert hosts.processes_of("t-prom") == []
