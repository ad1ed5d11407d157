"""`ucmctl image build`: on each node that runs a derived image, build it FROM the topology's
image with the wheel of this ucmctl added by the image's own Python (offline: `--network none`,
the base image as the node has it, or pulled as the topology's `pull` says).

The derived image carries two tags, the plan's name (plan/containers.py `derived_image`) and one
with the wheel's digest, and the digest as a label: that label is the record preflight reads to
refuse a missing or stale image. A node whose image already holds this wheel builds nothing.

On Slurm with `runtime: oci`, the same command makes the node's OCI bundle beside the topology's:
its rootfs hard links of the base's (a copy on another filesystem) with the wheel unpacked in a
folder of its own, and a config.json with the plan's mounts (plan/containers.py `bundle_config`),
then imports the connector and the store in it through `srun --container`. The bundle's
ucmctl.json is the record preflight reads: the wheel and the base config.json it was made from.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import posixpath
import shlex
import tarfile
import time
import zipfile
from dataclasses import dataclass

from ucmctl.deploy.wheel import Wheel, installed_wheel
from ucmctl.launch import launcher_for
from ucmctl.launch.slurm import StepExecutor
from ucmctl.nodes.executor import Executor, NodeError, Result
from ucmctl.nodes.fanout import parallel
from ucmctl.plan.containers import BUNDLE_SITE, LABEL_WHEEL, bundle_config
from ucmctl.plan.model import ContainerPlan, Plan

# Installs the wheel with the image's Python: pip when the image has it, else unpacked into the
# platform's site-packages (a wheel is a zip whose files go there as they are).
_INSTALL = """
set -e
W=/tmp/ucmctl-image/{wheel}
if {python} -m pip --version >/dev/null 2>&1; then
  # an image is its own environment: a distribution Python marked externally managed (PEP 668) is fine
  PIP_BREAK_SYSTEM_PACKAGES=1 {python} -m pip install --quiet --no-deps --no-index --no-cache-dir \
    --force-reinstall "$W"
else
  {python} - "$W" <<'EOF'
import sys, sysconfig, zipfile
tag = "cp%d%d" % sys.version_info[:2]
if "-%s-" % tag not in sys.argv[1]:
    sys.exit("the image's Python is %s but the wheel is %s" % (tag, sys.argv[1]))
zipfile.ZipFile(sys.argv[1]).extractall(sysconfig.get_paths()["platlib"])
EOF
fi
{python} -c 'import ucm_connector, ucm_store'
rm -rf /tmp/ucmctl-image
"""


@dataclass(frozen=True)
class Built:
    node: str
    image: str
    seconds: float
    reused: bool


def wheel_tag_name(image: str, wheel: Wheel) -> str:
    """The derived image's second tag: its plan tag with the wheel's digest."""
    return f"{image}-w{wheel.sha256[:12]}"


def derived_images(plan: Plan) -> dict[str, list[ContainerPlan]]:
    """Node -> the derived images (and OCI bundles) its processes run (one per image)."""
    out: dict[str, dict[str, ContainerPlan]] = {}
    for p in plan.processes:
        if p.container is not None and (p.container.derived or p.container.runtime == "oci"):
            out.setdefault(p.node, {}).setdefault(p.container.image, p.container)
    return {node: list(images.values()) for node, images in out.items()}


def image_wheel(ex: Executor, c: ContainerPlan) -> str | None:
    """The wheel digest a node's image carries ('' without the label), None when it is missing."""
    rt = shlex.quote(c.runtime)
    fmt = shlex.quote('{{index .Config.Labels "' + LABEL_WHEEL + '"}}')
    done = ex.run(f"{rt} image inspect --format {fmt} {shlex.quote(c.image)} 2>/dev/null", timeout=60)
    if not done.ok:
        return None
    value = done.stdout.strip()
    return "" if value in ("", "<no value>") else value


def build_one(ex: Executor, c: ContainerPlan, wheel: Wheel, folder: str) -> Built:
    start = time.monotonic()
    if image_wheel(ex, c) == wheel.sha256:
        return Built(ex.node.name, c.image, time.monotonic() - start, reused=True)
    context = posixpath.join(folder, f"image-{wheel.sha256[:12]}")
    ex.put(posixpath.join(context, wheel.filename), wheel.data)
    ex.put(
        posixpath.join(context, "install.sh"),
        _INSTALL.format(wheel=wheel.filename, python=shlex.quote(c.python)).encode(),
    )
    containerfile = (
        f"FROM {c.base_image}\n"
        f"COPY {wheel.filename} install.sh /tmp/ucmctl-image/\n"
        "RUN sh /tmp/ucmctl-image/install.sh\n"
        f"LABEL {LABEL_WHEEL}={wheel.sha256}\n"
    )
    ex.put(posixpath.join(context, "Containerfile"), containerfile.encode())
    rt = shlex.quote(c.runtime)
    pull = f"--pull={c.pull}" if c.runtime == "podman" else ("--pull" if c.pull == "always" else "")
    tags = f"--tag {shlex.quote(c.image)} --tag {shlex.quote(wheel_tag_name(c.image, wheel))}"
    build = f"{rt} build --quiet --network none {pull} {tags} --file Containerfile ."
    if c.runtime == "docker":  # a docker CLI without buildx builds with the classic builder
        build = f"if {rt} buildx version >/dev/null 2>&1; then {build}; else DOCKER_BUILDKIT=0 {build}; fi"
    done = ex.run(
        f"cd {shlex.quote(context)} && {{ {build}; }} && cd / && rm -rf {shlex.quote(context)}", timeout=1800
    )
    if not done.ok:
        said = (done.stderr.strip() or done.stdout.strip()).splitlines()[-4:]
        raise NodeError(
            ex.node.name, f"{c.runtime} build of {c.image} from {c.base_image} failed: " + " / ".join(said)
        )
    return Built(ex.node.name, c.image, time.monotonic() - start, reused=False)


BUNDLE_RECORD = "ucmctl.json"


def bundle_record(base_config: str, c: ContainerPlan, wheel: Wheel) -> dict[str, str | None]:
    """What a derived OCI bundle is made of: its base's config.json and, when derived, the wheel."""
    return {
        "base": c.base_image,
        "base_config": hashlib.sha256(base_config.encode()).hexdigest(),
        "wheel": wheel.sha256 if c.derived else None,
    }


def read_base_config(ex: Executor, c: ContainerPlan) -> str:
    """The base bundle's config.json; a NodeError when the folder is no OCI bundle.

    Its size comes first: a job step's output can reach srun cut short at a line's end (seen
    under load), and a config read in part must never be taken for a broken one; such a read is
    tried again."""
    base, q = c.base_image, shlex.quote
    config = base + "/config.json"
    command = f"test -d {q(base + '/rootfs')} && wc -c < {q(config)} && cat {q(config)}"
    for _ in range(3):
        done = ex.run(command)
        if not done.ok:
            raise NodeError(
                ex.node.name,
                f"{base} is not an OCI bundle (a folder with config.json and "
                "rootfs/): make one there (`umoci unpack`, or an image's files in rootfs/ and "
                "`runc spec`)",
            )
        size, _, text = done.stdout.partition("\n")
        if size.strip().isdigit() and len(text.encode()) >= int(size):
            return text
        if _parses(text):  # newlines translated on the way: whole all the same
            return text
    raise NodeError(
        ex.node.name,
        f"{config} came back cut short three times (the node's output did not "
        "reach this machine whole): try again",
    )


def _parses(text: str) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return False
    return True


def bundle_state(ex: Executor, c: ContainerPlan) -> dict[str, str | None] | None:
    """The record of the node's derived bundle, None when it has none (never made, or made partly)."""
    done = ex.run(f"cat {shlex.quote(posixpath.join(c.image, BUNDLE_RECORD))} 2>/dev/null")
    try:
        return json.loads(done.stdout) if done.ok else None
    except ValueError:
        return None


def _wheel_tar(wheel: Wheel) -> bytes:
    """The wheel's files as a tar (every node has tar; a wheel is a zip whose files go into
    site-packages as they are)."""
    out = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(wheel.data)) as z, tarfile.open(fileobj=out, mode="w") as tar:
        for entry in z.infolist():
            if entry.is_dir():
                continue
            data = z.read(entry)
            info = tarfile.TarInfo(entry.filename)
            info.size, info.mode, info.mtime = len(data), 0o644, 315532800
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


def build_bundle(ex: Executor, c: ContainerPlan, wheel: Wheel) -> Built:
    """Make (or find made) the node's OCI bundle of `c`: built under a temporary name, the import
    checked in it, then renamed into place, so a bundle under its name is always whole."""
    start = time.monotonic()
    q = shlex.quote
    base_config = read_base_config(ex, c)
    try:
        parsed = json.loads(base_config)
    except ValueError as exc:
        raise NodeError(ex.node.name, f"{c.base_image}/config.json is not JSON ({exc})") from None
    record = bundle_record(base_config, c, wheel)
    if bundle_state(ex, c) == record:
        return Built(ex.node.name, c.image, time.monotonic() - start, reused=True)
    partial = f"{c.image}.partial-{os.getpid()}-{time.monotonic_ns()}"
    rootfs, base_rootfs = q(partial + "/rootfs"), q(c.base_image + "/rootfs")
    # hard links where the bundle is on the base's filesystem, else a copy
    linked = f"cp -al {base_rootfs} {rootfs} 2>/dev/null"
    copied = f"rm -rf {rootfs} && cp -a {base_rootfs} {rootfs}"
    copy = f"rm -rf {q(partial)} && mkdir -p {q(partial)} && {{ {linked} || {{ {copied}; }}; }}"
    done = ex.run(copy, timeout=1800)
    try:
        if not done.ok:
            raise NodeError(ex.node.name, f"cannot make {partial}: {_said(done.stderr)}")
        if c.derived:  # a folder of its own: no file of the base's (a hard link) is written
            ex.put(partial + "/wheel.tar", _wheel_tar(wheel))
            site = q(partial + "/rootfs" + BUNDLE_SITE)
            done = ex.run(
                f"mkdir -p {site} && tar -xf {q(partial + '/wheel.tar')} -C {site} && "
                f"rm {q(partial + '/wheel.tar')}",
                timeout=300,
            )
            if not done.ok:
                raise NodeError(ex.node.name, f"cannot unpack the wheel into {partial}: {_said(done.stderr)}")
        ex.put(partial + "/config.json", json.dumps(bundle_config(parsed, c.mounts, c.derived), indent=1))
        probe = f"{q(c.python)} -c 'import ucm_connector, ucm_store'"
        done = _run_in(ex, probe, [f"--container={partial}"])
        if not done.ok:
            fix = (
                "the image's Python must be the CPython the wheel was built for"
                if c.derived
                else "put ucmctl into the bundle's rootfs, or set derived true"
            )
            raise NodeError(
                ex.node.name,
                f"the connector does not import in {c.base_image}'s bundle "
                f"({_said(done.stderr or done.stdout)}): {fix}",
            )
        ex.put(partial + "/" + BUNDLE_RECORD, json.dumps(record, indent=1))
        old, bundle = q(f"{c.image}.old-{os.getpid()}"), q(c.image)
        # mv -T: never into a bundle another node (on the same shared folder) has just put there
        swap = f"if [ -e {bundle} ]; then mv -T {bundle} {old} && rm -rf {old}; fi; "
        swap += f"mv -T {q(partial)} {bundle}"
        done = ex.run(swap, timeout=600)
        if not done.ok and bundle_state(ex, c) != record:
            raise NodeError(ex.node.name, f"cannot put the bundle at {c.image}: {_said(done.stderr)}")
    finally:
        ex.run(f"rm -rf {q(partial)}", timeout=600)
    return Built(ex.node.name, c.image, time.monotonic() - start, reused=False)


def _said(text: str) -> str:
    return " / ".join(text.strip().splitlines()[-3:])


def _run_in(ex: Executor, command: str, container: list[str]) -> Result:
    """`command` in a container on a Slurm node: a job step with srun's container options."""
    assert isinstance(ex, StepExecutor), f"{ex.node.name}: OCI bundles run as Slurm job steps"
    return ex.run_in(command, container, timeout=300)


def build_images(plan: Plan, *, accept_new_host_keys: bool = False) -> list[Built]:
    """Build (or find already built) every derived image of the plan on its nodes, in parallel."""
    wanted = derived_images(plan)
    wheel = installed_wheel()
    launcher = launcher_for(plan, accept_new_host_keys=accept_new_host_keys)

    def one(node: str) -> list[Built]:
        ex = launcher.standalone(node)
        folder = posixpath.join(posixpath.dirname(plan.nodes[node].run_dir), "images")
        return [
            build_bundle(ex, c, wheel) if c.runtime == "oci" else build_one(ex, c, wheel, folder)
            for c in wanted[node]
        ]

    try:
        return [b for built in parallel(list(wanted), one) for b in built]
    finally:
        launcher.close()
