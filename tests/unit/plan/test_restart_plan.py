"""`restart:` in the Plan: which mechanism restarts a process (the container runtime's own
`--restart`, else ucmctl's supervisor script), and nothing at all by default."""

from __future__ import annotations

import io
import subprocess

from rich.console import Console

from ucmctl.plan.build import build_plan
from ucmctl.plan.show import print_plan
from ucmctl.topology.load import parse_topology

BASE = """
name: r
mode: centralized
model: {path: /models/tiny}
nodes:
  a: {host: 10.0.0.1, platform: cpu, devices: 0%s}
storage: {storage_backends: /srv/kv}
prefill: {nodes: [a], port: 8000, env: {VLLM_CPU_OMP_THREADS_BIND: "0"}}
decode: {nodes: [a], port: 8001, env: {VLLM_CPU_OMP_THREADS_BIND: "1"}%s}
proxy: {node: a, port: 8002%s}
"""
PODMAN = ", container: {runtime: podman, image: localhost/vllm-cpu:0.32, derived: false}"


def _topology(node: str = "", decode: str = "", proxy: str = ""):  # type: ignore[no-untyped-def]
    return parse_topology(BASE % (node, decode, proxy))


def test_no_restart_unless_asked_and_the_digest_of_older_topologies_holds() -> None:
    plain = _topology()
    assert all(p.restart is None for p in build_plan(plain).processes)
    assert _topology(decode=", restart: never").digest() == plain.digest()
    assert _topology(decode=", restart: on-failure").digest() != plain.digest()


def test_bare_servers_get_the_supervisor_script() -> None:
    plan = build_plan(_topology(decode=", restart: {policy: on-failure, max_restarts: 2, backoff_s: 1.5}",
                                proxy=", restart: on-failure"))  # fmt: skip
    decode, proxy, prefill = plan.process("decode-0"), plan.process("proxy"), plan.process("prefill-0")
    assert prefill.restart is None and prefill.launch.endswith("/prefill-0/launch.sh")
    assert decode.restart is not None and decode.restart.by == "supervisor"
    assert (decode.restart.max_restarts, decode.restart.backoff_s) == (2, 1.5)
    assert decode.launch.endswith("/decode-0/supervise.sh") and decode.restart.state is not None
    assert decode.restart.state.endswith("/decode-0/restarts")
    files = {f.path.rsplit("/", 1)[1]: f for f in decode.files}
    script = files["supervise.sh"].content
    assert files["supervise.sh"].mode == 0o755 and "launch.sh" in files
    assert "at most 2 times, 1.5 s after" in script and '"$n" -ge 2' in script and "sleep 1.5 &" in script
    assert subprocess.run(["sh", "-n"], input=script, text=True).returncode == 0  # it parses
    assert proxy.restart is not None and (proxy.restart.max_restarts, proxy.restart.backoff_s) == (3, 5.0)
    out = io.StringIO()
    print_plan(plan, Console(file=out, width=200))
    assert "restart on-failure, at most 2x, 1.5 s apart, by ucmctl's supervisor on the node" in out.getvalue()


def test_containers_are_restarted_by_their_runtime() -> None:
    plan = build_plan(_topology(node=PODMAN, decode=", restart: {policy: on-failure, max_restarts: 4}"))
    decode = plan.process("decode-0")
    assert decode.container is not None and decode.restart is not None
    assert decode.restart.by == "podman" and decode.restart.backoff_s is None
    assert "--restart=on-failure:4" in decode.container.argv
    assert decode.container.argv.index("--restart=on-failure:4") < decode.container.argv.index(
        decode.container.image
    )  # a runtime option, not the server's
    assert not any(f.path.endswith("supervise.sh") for f in decode.files)
    assert decode.launch.endswith("/decode-0/launch.sh")
    assert "--restart=on-failure:4" in next(f.content for f in decode.files if f.path == decode.launch)
    assert "--restart" not in " ".join(plan.process("prefill-0").container.argv)  # type: ignore[union-attr]


def test_on_a_systemd_node_a_unit_restarts_bare_processes_and_containers_keep_their_runtime() -> None:
    restart = ", restart: {policy: on-failure, max_restarts: 2, backoff_s: 1.5}"
    plan = build_plan(_topology(node=", systemd: true", decode=restart))
    decode, prefill = plan.process("decode-0"), plan.process("prefill-0")
    assert plan.nodes["a"].systemd and prefill.restart is None
    assert decode.restart is not None and decode.restart.by == "systemd"
    assert (decode.restart.max_restarts, decode.restart.backoff_s) == (2, 1.5)
    assert decode.launch.endswith("/decode-0/launch.sh")  # no supervisor: the unit runs unit.sh
    files = {f.path.rsplit("/", 1)[1]: f for f in decode.files}
    assert "supervise.sh" not in files and decode.restart.script == files["unit.sh"].path
    unit_sh = files["unit.sh"].content
    assert files["unit.sh"].mode == 0o755
    assert subprocess.run(["sh", "-n"], input=unit_sh, text=True).returncode == 0
    assert f"exec env UCMCTL_PROCESS=decode-0@{decode.launch} sh {decode.launch} >>{decode.log}" in unit_sh
    assert f"pidfile={decode.pidfile}" in unit_sh
    out = io.StringIO()
    print_plan(plan, Console(file=out, width=200))
    assert "restart on-failure, at most 2x, 1.5 s apart, by systemd (a transient unit)" in out.getvalue()
    # a container on that node is still restarted by its runtime
    contained = build_plan(_topology(node=", systemd: true" + PODMAN, decode=", restart: on-failure"))
    assert contained.process("decode-0").restart.by == "podman"  # type: ignore[union-attr]
    # and a node that does not say systemd keeps the digest it had
    assert _topology(node=", systemd: false").digest() == _topology().digest()
    assert _topology(node=", systemd: true").digest() != _topology().digest()
