"""`ucmctl image build`: on each node that runs a derived image, build it FROM the topology's
image with the wheel of this ucmctl added by the image's own Python (offline: `--network none`,
the base image as the node has it, or pulled as the topology's `pull` says).

The derived image carries two tags, the plan's name (plan/containers.py `derived_image`) and one
with the wheel's digest, and the digest as a label: that label is the record preflight reads to
refuse a missing or stale image. A node whose image already holds this wheel builds nothing.
"""

from __future__ import annotations

import posixpath
import shlex
import time
from dataclasses import dataclass

from ucmctl.deploy.wheel import Wheel, installed_wheel
from ucmctl.launch import launcher_for
from ucmctl.nodes.executor import Executor, NodeError
from ucmctl.nodes.fanout import parallel
from ucmctl.plan.containers import LABEL_WHEEL
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
    """Node -> the derived images its processes run (one per image)."""
    out: dict[str, dict[str, ContainerPlan]] = {}
    for p in plan.processes:
        if p.container is not None and p.container.derived:
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
    done = ex.run(f"cd {shlex.quote(context)} && {{ {build}; }} && cd / && rm -rf {shlex.quote(context)}",
                  timeout=1800)  # fmt: skip
    if not done.ok:
        said = (done.stderr.strip() or done.stdout.strip()).splitlines()[-4:]
        raise NodeError(
            ex.node.name, f"{c.runtime} build of {c.image} from {c.base_image} failed: " + " / ".join(said)
        )
    return Built(ex.node.name, c.image, time.monotonic() - start, reused=False)


def build_images(plan: Plan, *, accept_new_host_keys: bool = False) -> list[Built]:
    """Build (or find already built) every derived image of the plan on its nodes, in parallel."""
    wanted = derived_images(plan)
    wheel = installed_wheel()
    launcher = launcher_for(plan, accept_new_host_keys=accept_new_host_keys)

    def one(node: str) -> list[Built]:
        ex = launcher.standalone(node)
        folder = posixpath.join(posixpath.dirname(plan.nodes[node].run_dir), "images")
        return [build_one(ex, c, wheel, folder) for c in wanted[node]]

    try:
        return [b for built in parallel(list(wanted), one) for b in built]
    finally:
        launcher.close()
