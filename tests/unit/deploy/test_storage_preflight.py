"""Preflight of the store's folder: the shell lines of the first storage node (the marker's
writer) and of another run for real here, in mount namespaces of the test's own, on a folder
that takes O_DIRECT, on a ramfs (which refuses O_DIRECT), on a read-only bind mount and on
another folder, and the answers are judged into one line each, with the fix (the same lines
against real shared and unshared filesystems: tests/integration/deploy/test_ssh_deploy.py)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from ucmctl.deploy.preflight import NodeFacts
from ucmctl.deploy.storage_preflight import SharedCheck
from ucmctl.nodes.executor import Result
from ucmctl.plan.build import build_plan
from ucmctl.topology.load import parse_topology


def plan_for(backend: str, io_direct: bool) -> SharedCheck:
    text = f"""
name: st
mode: centralized
engine: sim
model: {{path: sim-model}}
nodes:
  a: {{host: 10.0.0.1, platform: cpu, devices: 0}}
  b: {{host: 10.0.0.2, platform: cpu, devices: 0}}
storage: {{storage_backends: {backend}, io_direct: {str(io_direct).lower()}}}
prefill: {{nodes: [a], port: 8000}}
decode: {{nodes: [b], port: 8001}}
proxy: {{node: a, port: 8002}}
"""
    return SharedCheck(build_plan(parse_topology(text)))


def facts_of(shell: str, mount: str = "") -> dict[str, str]:
    """The writer's answers, its lines run after `mount` in a mount namespace of their own."""
    script = f"set -e; {mount}\nset +e\n{shell}" if mount else shell
    out = subprocess.run(["unshare", "--mount", "bash", "-c", script], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    return dict(line.partition("=")[::2] for line in out.stdout.splitlines() if "=" in line)


@pytest.mark.parametrize("io_direct", [False, True])
def test_a_folder_that_takes_o_direct_passes_and_its_marker_is_left_for_the_readers(
    tmp_path: Path, io_direct: bool
) -> None:
    check = plan_for(str(tmp_path / "kv"), io_direct)
    facts = facts_of(check.write_lines())
    assert facts == {"shared0": "ok", "direct0": "1"}
    assert (tmp_path / "kv" / f".ucmctl-shared-check-{check.token}").read_text().strip() == check.token
    assert not list((tmp_path / "kv").glob("*.direct"))  # the probe page is gone
    assert check.judge(NodeFacts("a", facts), {}, all_reachable=False) == []


def test_no_o_direct_with_io_direct_on_is_refused_with_the_fix(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    ramfs = f"mount -t ramfs ucmctl-test {shared}"  # ramfs refuses O_DIRECT opens (EINVAL)
    off, on = plan_for(f"{shared}/kv", False), plan_for(f"{shared}/kv", True)
    facts = facts_of(off.write_lines(), ramfs)
    assert facts == {"shared0": "ok", "direct0": "0"}
    assert off.judge(NodeFacts("a", facts), {}, all_reachable=False) == []
    (said,) = on.judge(NodeFacts("a", facts_of(on.write_lines(), ramfs)), {}, all_reachable=False)
    assert said == (
        f"node a: storage backend {shared}/kv refuses O_DIRECT writes (a 4 KiB page, the store's alignment) "
        "but storage.io_direct is true: set storage.io_direct: false (buffered I/O), or put the store on "
        "a filesystem that takes O_DIRECT"
    )


def test_a_read_only_mount_is_named_with_the_fix(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    check = plan_for(f"{shared}/kv", False)
    facts = facts_of(
        check.write_lines(), f"mount --bind {shared} {shared}; mount -o remount,bind,ro {shared}"
    )
    assert "Read-only file system" in facts["shared0"], facts
    (said,) = check.judge(NodeFacts("a", facts), {}, all_reachable=True)
    assert said == (
        f"node a: cannot write to storage backend {shared}/kv: {facts['shared0'].strip()}: the filesystem is "
        "mounted read-only there: remount it read-write, or choose another path"
    )
    assert not (shared / "kv").exists()


class NodeWithMounts:
    """Another node: the preflight's lines for it run here, in a mount namespace of their own where
    `mount` has changed what the shared folder is."""

    def __init__(self, mount: str) -> None:
        self.mount = mount

    def run(self, command: str, *, timeout: float = 60) -> Result:
        script = f"{self.mount} || exit 99\n{command}" if self.mount else command
        done = subprocess.run(["unshare", "--mount", "sh", "-c", script], capture_output=True, text=True)
        assert done.returncode != 99, done.stderr
        return Result(command, done.returncode, done.stdout, done.stderr)


@pytest.mark.parametrize("view", ["same", "read-only", "another folder"])
def test_every_other_node_must_see_the_marker_and_write_there(tmp_path: Path, view: str) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    mount = {
        "same": "",
        "read-only": f"mount --bind {shared} {shared} && mount -o remount,bind,ro {shared}",
        "another folder": f"mount -t tmpfs ucmctl-test {shared} && mkdir {shared}/kv",
    }[view]
    check = plan_for(f"{shared}/kv", False)
    facts = facts_of(check.write_lines())
    said = check.judge(NodeFacts("a", facts), {"b": NodeWithMounts(mount)}, all_reachable=True)
    if view == "same":
        assert said == []
    elif view == "read-only":
        (line,) = said
        assert line.startswith(f"node b: cannot write to storage backend {shared}/kv: ")
        assert "Read-only file system" in line
        assert line.endswith(
            ": the filesystem is mounted read-only there: remount it read-write, or choose another path"
        )
    else:
        assert said == [
            f"node b: storage backend {shared}/kv is not the filesystem node a wrote to: mount the same "
            f"shared storage (NFS, 3FS) at {shared}/kv on every node"
        ]
    # b's probe file is gone: only a's marker is left for the cleanup
    assert [p.name for p in (shared / "kv").iterdir()] == [f".ucmctl-shared-check-{check.token}"]
