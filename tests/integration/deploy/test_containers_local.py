"""A centralized 1P1D of the simulator with every process in a real podman (then docker) container
on this machine: `image build` derives the image (and reuses it), `up` gates on health and the KV probe,
a request goes through the proxy, `status` reads a kill -9 as `exited (137)` from the runtime,
`down` leaves no container and no process. The image stands in for a user's vLLM image (built
from Debian and the venv's packages, without ucmctl: tests/support/containers.py)."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.cli import Cli
from tests.support.containers import (
    build_base_image,
    cgroup_parent,
    podman,
    remove_cgroup,
    remove_containers,
    remove_images,
    write_podman_config,
)
from tests.support.docker import docker_daemon, load_from_podman, unmount_below
from tests.support.http import completion
from tests.support.processes import free_port
from ucmctl.deploy.health import why_not

pytestmark = [pytest.mark.slow, pytest.mark.root]
SHARES = "containers"  # podman, docker, their cgroups: one module at a time (tests/support/fixtures.py)

if os.geteuid() != 0 or shutil.which("podman") is None:
    pytest.skip("rootful podman is installed by scripts/setup.sh --tests (root)", allow_module_level=True)

NAME = "pod-1p1d"
BASE = "ucmctl-test-sim:1"
DERIVED = f"localhost/ucmctl/localhost/{BASE}"  # what `ucmctl image build` makes of it


@pytest.fixture(scope="module")
def podman_env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """A podman configuration of the tests' own, with the base image in it."""
    folder = tmp_path_factory.mktemp("podman")
    env = write_podman_config(folder)
    build_base_image(env, BASE, engine=False)
    yield env
    remove_containers(env, f"io.ucmctl.deployment={NAME}")
    remove_images(env, [i for i in podman(env, "images", "--format", "{{.Repository}}:{{.Tag}}").split()])
    subprocess.run(["podman", "system", "reset", "--force"], env={**os.environ, **env}, capture_output=True,
                   timeout=120, check=False)  # fmt: skip
    unmount_below(folder)


@pytest.fixture(params=["podman", "docker"])
def runtime(request: pytest.FixtureRequest, podman_env: dict[str, str], tmp_path: Path) -> Iterator[Runtime]:
    group = f"ucmctl-test-{os.getpid()}-{request.param}"
    if request.param == "podman":
        yield Runtime("podman", podman_env, cgroup_parent(group))
    else:
        if shutil.which("dockerd") is None:
            pytest.fail("dockerd is installed by scripts/setup.sh --tests (docker.io)")
        with docker_daemon(tmp_path / "docker") as env:
            load_from_podman(podman_env, env, f"localhost/{BASE}")
            yield Runtime("docker", env, cgroup_parent(group))
    remove_cgroup(group)


@dataclass(frozen=True)
class Runtime:
    name: str
    env: dict[str, str]  # how to reach it: podman's configuration, docker's socket
    cgroup: str  # the containers' cgroup parent, under this test's own

    def __call__(self, *args: str) -> str:
        done = subprocess.run([self.name, *args], env={**os.environ, **self.env}, capture_output=True,
                              text=True, timeout=120, check=False)  # fmt: skip
        assert done.returncode == 0, f"{self.name} {' '.join(args)}: {done.stderr}"
        return done.stdout

    def containers(self) -> dict[str, tuple[str, str]]:
        """The deployment's containers: process -> (name, state)."""
        ids = self("ps", "-aq", "--filter", f"label=io.ucmctl.deployment={NAME}").split()
        if not ids:
            return {}
        fmt = '{{index .Config.Labels "io.ucmctl.process"}} {{.Name}} {{.State.Status}}'
        rows = [line.split() for line in self("inspect", "--format", fmt, *ids).splitlines()]
        return {r[0]: (r[1].lstrip("/"), r[2]) for r in rows}


def ucmctl(env: dict[str, str], home: Path, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return Cli(home, env={**env, "COLUMNS": "80"}, timeout=timeout)(*args)


def topology(tmp: Path, runtime: str, cgroup: str) -> Path:
    work = tmp / "work"
    path = tmp / "pod.yaml"
    path.write_text(f"""
name: {NAME}
mode: centralized
engine: sim
model: {{path: sim-model}}
nodes:
  me:
    host: 127.0.0.1
    transport: local
    platform: cpu
    workdir: {json.dumps(str(work))}
    container:
      runtime: {runtime}
      image: localhost/{BASE}
      pull: never
      options: [--cgroup-parent={cgroup}]
storage: {{storage_backends: {json.dumps(str(work / "store"))}, cache_buffer_capacity_gb: 0.25}}
prefill: {{nodes: [me], port: {free_port()}, restart: on-failure}}
decode: {{nodes: [me], port: {free_port()}}}
proxy: {{node: me, port: {free_port()}}}
""")
    return path


def test_a_containerized_1p1d_builds_runs_crashes_and_goes(runtime: Runtime, tmp_path: Path) -> None:
    env, home = runtime.env, tmp_path / "home"
    topo = topology(tmp_path, runtime.name, runtime.cgroup)

    up = ucmctl(env, home, "up", str(topo))  # no derived image yet: refused before anything starts
    assert up.returncode == 3, up.stderr
    assert "is missing: run `ucmctl image build TOPOLOGY`" in up.stderr and runtime.containers() == {}

    built = ucmctl(env, home, "image", "build", str(topo))
    assert built.returncode == 0, built.stderr
    assert re.fullmatch(rf"me: {re.escape(DERIVED)} built in [0-9.]+ s", built.stdout.strip())
    again = ucmctl(env, home, "image", "build", str(topo))  # the same wheel: nothing built
    assert again.stdout.strip() == f"me: {DERIVED} already holds this ucmctl"
    tags = runtime("images", "--format", "{{.Repository}}:{{.Tag}}").split()
    assert any(re.fullmatch(rf"{re.escape(DERIVED)}-w[0-9a-f]{{12}}", t) for t in tags), tags

    up = ucmctl(env, home, "up", str(topo))
    assert up.returncode == 0, up.stdout + up.stderr
    assert runtime.containers() == {
        p: (f"ucmctl-{NAME}-{p}", "running") for p in ("prefill-0", "decode-0", "proxy")
    }

    record = json.loads((home / "deployments" / f"{NAME}.json").read_text())
    proxy = next(p for p in record["plan"]["processes"] if p["name"] == "proxy")
    answer = completion(proxy["url"], list(range(1, 300)), max_tokens=4)
    assert answer["usage"]["completion_tokens"] == 4

    # the container's processes are inside the cgroup the topology gave it
    assert runtime.cgroup in runtime("exec", f"ucmctl-{NAME}-decode-0", "cat", "/proc/self/cgroup")

    logs = ucmctl(env, home, "logs", NAME, "decode-0")
    assert logs.returncode == 0 and "decode-0@me | " in logs.stdout

    pid = int(runtime("inspect", "--format", "{{.State.Pid}}", f"ucmctl-{NAME}-decode-0").strip())
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and runtime.containers()["decode-0"][1] == "running":
        time.sleep(0.2)
    status = ucmctl(env, home, "status", NAME)
    assert status.returncode == 0, status.stderr
    decode_line = next(line for line in status.stdout.splitlines() if "decode-0" in line)
    assert "exited (137)" in decode_line, status.stdout
    prefill_line = next(line for line in status.stdout.splitlines() if "prefill-0" in line)
    assert "healthy" in prefill_line, status.stdout

    # the only decode instance is down: restarting it takes nothing out of routing (no --force)
    restarted = ucmctl(env, home, "restart", "decode-0")
    assert restarted.returncode == 0, restarted.stdout + restarted.stderr
    assert restarted.stdout.strip() == "1 process restarted", restarted.stdout
    assert runtime.containers()["decode-0"] == (f"ucmctl-{NAME}-decode-0", "running")
    answer = completion(proxy["url"], list(range(1, 300)), max_tokens=4)
    assert answer["usage"]["completion_tokens"] == 4

    # prefill's restart: on-failure is the runtime's own --restart: a SIGKILL of its main
    # process (what `bench --fault kill:prefill-0` sends) brings it back by itself
    fmt = "{{.HostConfig.RestartPolicy.Name}} {{.HostConfig.RestartPolicy.MaximumRetryCount}}"
    assert runtime("inspect", "--format", fmt, f"ucmctl-{NAME}-prefill-0").split() == ["on-failure", "3"]
    pid = int(runtime("inspect", "--format", "{{.State.Pid}}", f"ucmctl-{NAME}-prefill-0").strip())
    os.kill(pid, signal.SIGKILL)
    prefill_url = next(p["url"] for p in record["plan"]["processes"] if p["name"] == "prefill-0")
    deadline = time.monotonic() + 60
    prefill_line = ""
    while time.monotonic() < deadline:
        status = ucmctl(env, home, "status", NAME)
        prefill_line = next(line for line in status.stdout.splitlines() if "prefill-0" in line)
        if "restarted 1x" in prefill_line and why_not(prefill_url + "/health") is None:
            break
        time.sleep(1)
    assert "running, restarted 1x" in prefill_line and prefill_line.split()[-1] == "1", status.stdout
    assert why_not(prefill_url + "/health") is None  # it answers again

    # another plan's container of this deployment (found by its label), and someone else's
    sleeper = ["--init", f"localhost/{BASE}", "python3", "-c", "import time; time.sleep(600)"]
    runtime("run", "-d", "--name", "stray", "--label", f"io.ucmctl.deployment={NAME}",
            "--label", "io.ucmctl.process=decode-7", *sleeper)  # fmt: skip
    runtime("run", "-d", "--name", "not-ours", "--label", "io.ucmctl.deployment=other", *sleeper)
    if runtime.name == "docker":  # the record is lost: `down TOPOLOGY` finds them all the same
        (home / "deployments" / f"{NAME}.json").unlink()
        down = ucmctl(env, home, "down", str(topo))
    else:
        down = ucmctl(env, home, "down", NAME)
    assert down.returncode == 0, down.stderr
    assert f"stopped a process of {NAME} not in its plan: decode-7 on me" in down.stderr
    assert runtime.containers() == {}
    assert runtime("ps", "-a", "--format", "{{.Names}}").split() == ["not-ours"]
    runtime("rm", "-f", "not-ours")
    left = subprocess.run(["pgrep", "-f", f"{tmp_path}/work"], capture_output=True, text=True, check=False)
    assert left.stdout.strip() == ""


@pytest.mark.parametrize(
    "container, said",
    [
        ("{runtime: podman, image: localhost/not-here:1, derived: false, pull: never}",
         "image localhost/not-here:1 is not on the node and container.pull is never: load it there"),
        (f"{{runtime: podman, image: localhost/{BASE}, derived: false}}",  # the base image has no ucmctl
         f"image localhost/{BASE} has no ucmctl (ModuleNotFoundError: No module named 'ucm_connector')"),
        (f"{{runtime: podman, image: localhost/{BASE}, devices: [/dev/ucmctl-no-such-card]}}",
         "device /dev/ucmctl-no-such-card does not exist on the node"),
    ],
)  # fmt: skip
def test_preflight_refuses_what_the_node_lacks_and_starts_nothing(
    podman_env: dict[str, str], tmp_path: Path, container: str, said: str
) -> None:
    text = topology(tmp_path, "podman", "/").read_text()
    topo = tmp_path / "bad.yaml"
    topo.write_text(re.sub(r"    container:\n(      .*\n)+", f"    container: {container}\n", text))
    up = ucmctl(podman_env, tmp_path / "home", "up", str(topo))
    assert up.returncode == 3, up.stdout + up.stderr
    lines = [line for line in up.stderr.splitlines() if line.startswith("error:")]
    assert any(f"node me (127.0.0.1): {said}" in line for line in lines), up.stderr
    ids = podman(podman_env, "ps", "-aq", "--filter", f"label=io.ucmctl.deployment={NAME}").split()
    assert ids == [] and not (tmp_path / "home" / "deployments" / f"{NAME}.json").exists()
