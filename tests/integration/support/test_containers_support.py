"""The container test support itself: a base image built here, seen by every test host; a container
started over SSH serves on its host's address, is that host's alone, and sits under the caller's memory
cgroup; nothing of it outlives the cleanup. Otherwise the container tests measure the wrong thing."""

from __future__ import annotations

import os
import subprocess
import time
import urllib.error
import urllib.request

import pytest

from tests.support.containers import build_base_image, cgroup_folders, cgroup_parent, podman, remove_cgroup
from tests.support.netns import Cluster, cluster_or_skip

pytestmark = [pytest.mark.root, pytest.mark.slow]
SHARES = "containers"  # podman, docker, their cgroups: one module at a time (tests/support/fixtures.py)

LABEL = "io.ucmctl.test=containers-support"


def ssh(c: Cluster, host: str, command: str) -> str:
    done = subprocess.run(["ssh", "-F", str(c.ssh_config), host, command],
                          capture_output=True, text=True, timeout=120, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def wait_http(url: str, timeout: float = 20) -> str:
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                return f"{r.status} {r.read().decode()}"
        except (urllib.error.URLError, ConnectionError):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def memory_cgroup(proc_self_cgroup: str) -> str:
    fields = [line.split(":", 2) for line in proc_self_cgroup.splitlines()]
    return next(path for _, kinds, path in fields if "memory" in kinds.split(","))


def test_a_container_on_a_host_serves_there_is_that_hosts_alone_and_leaves_nothing() -> None:
    with cluster_or_skip(2, containers=True) as c:
        image = build_base_image(c.image_env, "ucmctl-test-support:1", engine=False)
        assert image == "localhost/ucmctl-test-support:1"
        assert podman(c.image_env, "images", "--format", "{{.Repository}}:{{.Tag}}").split() == [image]
        for h in c.hosts:  # every host sees the image, from an SSH session, and keeps its own state
            check = "import aiohttp, numpy, pydantic, yaml, platform; print(platform.python_version())"
            assert ssh(c, h.name, f"podman run --rm --network host {image} python3 -c '{check}'") == "3.11.2"
            assert ssh(c, h.name, "podman info --format '{{.Store.GraphRoot}} {{.Store.RunRoot}}'") == (
                f"{c.base}/{h.name}/podman/storage {c.base}/{h.name}/podman/run"
            )
        check = "import importlib.util as u; print([u.find_spec(m) for m in ('ucmctl', 'ucm_store', 'vllm')])"
        assert ssh(c, "h1", f'podman run --rm {image} python3 -c "{check}"') == "[None, None, None]"

        # the SSH session's memory cgroup is this process's: the parent ucmctl would pass there
        group = f"ucmctl-test-support-{os.getpid()}"
        parent = cgroup_parent(group)
        assert memory_cgroup(ssh(c, "h1", "cat /proc/self/cgroup")) == parent.rsplit("/", 1)[0]
        h1 = c.host("h1")
        try:
            ssh(c, "h1", f"podman run -d --name web --label {LABEL} --network host --init "
                         f"--cgroup-manager=cgroupfs --cgroup-parent={parent} {image} "
                         f"python3 -m http.server --bind {h1.address} 8765")  # fmt: skip
            assert wait_http(f"http://{h1.address}:8765/").startswith("200 ")
            assert ssh(c, "h1", "podman ps --format '{{.Names}} {{.Labels}}'").startswith("web map[")
            assert ssh(c, "h2", "podman ps -a --format '{{.Names}}'") == ""
            inside = memory_cgroup(ssh(c, "h1", "podman exec web cat /proc/self/cgroup"))
            container_id = ssh(c, "h1", "podman inspect --format '{{.Id}}' web")
            assert inside == f"{parent}/libpod-{container_id}"
            assert (c.base / "h1/podman/run-containers/networks").is_dir()  # netavark's, the host's own
            assert cgroup_folders(group) != []
        finally:
            ssh(c, "h1", f"podman ps -a --filter label={LABEL} -q | xargs -r podman rm -f -t 0")
            remove_cgroup(group)
        assert ssh(c, "h1", "podman ps -a -q") == ""
        assert cgroup_folders(group) == []
        with pytest.raises(urllib.error.URLError):
            urllib.request.urlopen(f"http://{h1.address}:8765/", timeout=2)
