"""A private docker daemon for the tests (Debian's docker.io 20.10; shared/docs/containers-and-network-fs.md):
its own data root, exec root and socket, no iptables and no bridge (the tests' containers use the host's
network), cgroupfs so that `--cgroup-parent` keeps a container under the caller's cgroup."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path


def unmount_below(folder: Path) -> None:
    """Lazily unmount whatever podman or docker left mounted under `folder` (its storage driver's
    mounts outlive a reset), deepest first, so the folder can be removed."""
    root = str(folder.resolve())
    points = [line.split()[1] for line in Path("/proc/mounts").read_text().splitlines()]
    for point in sorted({p for p in points if p == root or p.startswith(root + "/")}, key=len, reverse=True):
        subprocess.run(["umount", "-l", point], capture_output=True, check=False)


@contextlib.contextmanager
def docker_daemon(folder: Path, timeout: float = 30) -> Iterator[dict[str, str]]:
    """A running dockerd with all its state in `folder` (its sockets in a short folder of /tmp: a
    socket's path has 107 bytes at most); the environment (DOCKER_HOST) to reach it."""
    folder.mkdir(parents=True, exist_ok=True)
    short = Path(tempfile.mkdtemp(prefix="ucd-", dir="/tmp"))
    sock = short / "docker.sock"
    log = (folder / "dockerd.log").open("wb")
    daemon = subprocess.Popen(
        ["dockerd", "--iptables=false", "--ip-forward=false", "--ip-masq=false", "--bridge=none",
         f"--data-root={folder / 'data'}", f"--exec-root={short / 'exec'}", f"--pidfile={short / 'pid'}",
         f"--host=unix://{sock}", "--exec-opt=native.cgroupdriver=cgroupfs"],
        stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    env = {"DOCKER_HOST": f"unix://{sock}"}
    try:
        deadline = time.monotonic() + timeout
        while subprocess.run(
            ["docker", "version"], env={**os.environ, **env}, capture_output=True
        ).returncode:
            if daemon.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"dockerd did not start: {(folder / 'dockerd.log').read_text()[-2000:]}")
            time.sleep(0.2)
        yield env
    finally:
        ids = docker(env, "ps", "-aq", check=False).split()
        if ids:
            docker(env, "rm", "-f", *ids, check=False)
        daemon.send_signal(signal.SIGTERM)
        try:
            daemon.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(daemon.pid, signal.SIGKILL)
            daemon.wait(timeout=10)
        log.close()
        unmount_below(folder)
        unmount_below(short)
        shutil.rmtree(short, ignore_errors=True)


def docker(env: dict[str, str], *args: str, check: bool = True, timeout: float = 300) -> str:
    done = subprocess.run(["docker", *args], env={**os.environ, **env}, capture_output=True, text=True,
                          timeout=timeout, check=False)  # fmt: skip
    if check and done.returncode:
        raise RuntimeError(f"docker {' '.join(args)}: exit {done.returncode}: {done.stderr.strip()}")
    return done.stdout


def load_from_podman(podman_env: dict[str, str], docker_env: dict[str, str], image: str) -> None:
    """`podman save IMAGE | docker load`: the image built once for podman, given to docker."""
    save = subprocess.Popen(
        ["podman", "save", image], stdout=subprocess.PIPE, env={**os.environ, **podman_env}
    )
    load = subprocess.run(["docker", "load"], stdin=save.stdout, capture_output=True, text=True,
                          env={**os.environ, **docker_env}, timeout=600, check=False)  # fmt: skip
    assert save.stdout is not None
    save.stdout.close()
    if save.wait(timeout=600) or load.returncode:
        raise RuntimeError(f"podman save | docker load of {image}: {load.stderr.strip()}")
