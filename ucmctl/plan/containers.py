"""A process in a container: the runtime's exact command line, computed with the rest of the plan.

Every container runs detached with an init process (so a stop is prompt), on the node's network
(`--network host`: its servers answer on the node's addresses, as bare ones do), with labels that
name the deployment, the process and the topology's digest, under a name made of them. It sees
the node's folders it needs at the same paths (the model, the store's backends, its own run
folder) and only its own cards: the visible-devices variable counts them as the container sees
them.
"""

from __future__ import annotations

import posixpath
import re

from ucmctl.core.platforms import Platform
from ucmctl.plan.model import ContainerPlan
from ucmctl.topology.container import Container, Mount

LABEL_DEPLOYMENT = "io.ucmctl.deployment"
LABEL_PROCESS = "io.ucmctl.process"
LABEL_TOPOLOGY = "io.ucmctl.topology-digest"
LABEL_WHEEL = "io.ucmctl.wheel-sha256"  # on a derived image: the digest of the wheel it holds
DERIVED_PREFIX = "localhost/ucmctl/"

# What vllm-ascend's container guide maps on an Atlas node besides the cards themselves.
ASCEND_DEVICES = ("/dev/davinci_manager", "/dev/devmm_svm", "/dev/hisi_hdc")
ASCEND_MOUNTS = (
    Mount(host="/usr/local/dcmi", container="/usr/local/dcmi"),
    Mount(host="/usr/local/bin/npu-smi", container="/usr/local/bin/npu-smi"),
    Mount(host="/usr/local/Ascend/driver/lib64", container="/usr/local/Ascend/driver/lib64"),
    Mount(host="/usr/local/Ascend/driver/version.info", container="/usr/local/Ascend/driver/version.info"),
    Mount(host="/etc/ascend_install.info", container="/etc/ascend_install.info"),
)
# MUSA (Moore Threads) and MACA (MetaX) without their vendors' container toolkits: the DRM nodes
# of every card (so the visible-devices variable keeps the node's numbering), and MetaX's
# control device. Not verified on either vendor's hardware.
MUSA_DEVICES = ("/dev/dri",)
MACA_DEVICES = ("/dev/dri", "/dev/mxcd")


def container_name(deployment: str, process: str) -> str:
    return f"ucmctl-{deployment}-{process}"


def derived_image(base: str) -> str:
    """The image `ucmctl image build` makes from `base`: the same name under localhost/ucmctl/
    (a registry port's `:` and a digest's `@sha256:` folded into the path and the tag)."""
    name, _, digest = base.partition("@sha256:")
    repo, tag = name.rsplit(":", 1) if ":" in name.rsplit("/", 1)[-1] else (name, "")
    tag = f"sha256-{digest[:12]}" if digest else (tag or "latest")
    return DERIVED_PREFIX + re.sub(r":", "-", repo) + ":" + tag


def card_mapping(
    platform: Platform, runtime: str, cards: list[int]
) -> tuple[list[str], list[str], str | None]:
    """The run options that map a process's cards, the device nodes they name on the node, and
    the visible-devices value inside the container (None: the variable is not set)."""
    if not cards:
        return [], [], None
    inside = ",".join(str(i) for i in range(len(cards)))  # cards mapped one by one count from 0
    if platform is Platform.cuda:
        if runtime == "docker":
            return ["--gpus", '"device=' + ",".join(str(c) for c in cards) + '"'], [], inside
        return [f"--device=nvidia.com/gpu={c}" for c in cards], [], inside  # CDI (nvidia-ctk cdi generate)
    if platform is Platform.ascend:
        nodes = [f"/dev/davinci{c}" for c in cards] + list(ASCEND_DEVICES)
        return [f"--device={d}" for d in nodes], nodes, inside
    kept = ",".join(str(c) for c in cards)  # every card's node is mapped: the node's numbering holds
    nodes = list(MUSA_DEVICES if platform is Platform.musa else MACA_DEVICES)
    return [f"--device={d}" for d in nodes], nodes, kept


def container_plan(
    spec: Container,
    *,
    deployment: str,
    process: str,
    topology_digest: str,
    platform: Platform,
    argv: list[str],
    env: dict[str, str],
    cards: list[int],
    device_variable: str | None,
    workdir: str,
    mounts: list[Mount],
) -> tuple[ContainerPlan, dict[str, str]]:
    """The container of one process, and the environment it runs with inside (its own cards'
    numbering in the visible-devices variable, then the container's `env`)."""
    assert spec.runtime in ("podman", "docker") and spec.image is not None
    runtime = spec.runtime
    name = container_name(deployment, process)
    labels = {LABEL_DEPLOYMENT: deployment, LABEL_PROCESS: process, LABEL_TOPOLOGY: topology_digest[:16]}
    card_options, card_nodes, visible = card_mapping(platform, runtime, cards)
    inside = dict(env)
    if device_variable and visible is not None:
        inside[device_variable] = visible
    inside.update(spec.env)

    every_mount = list(mounts) + (list(ASCEND_MOUNTS) if platform is Platform.ascend and cards else [])
    every_mount += spec.mounts
    seen: set[str] = set()
    volumes: list[str] = []
    for m in every_mount:
        if m.container not in seen:  # the first mount of a container path wins (the runtime refuses two)
            seen.add(m.container)
            volumes.append(f"--volume={m.option()}")

    image = derived_image(spec.image) if spec.derived else spec.image
    run = [runtime, "run", "--detach", "--init", f"--name={name}"]
    run += [f"--label={k}={v}" for k, v in labels.items()]
    run.append(f"--network={spec.network}")
    ipc = spec.ipc or ("private" if spec.shm_size else "host")
    run.append(f"--ipc={ipc}")
    if spec.shm_size:
        run.append(f"--shm-size={spec.shm_size}")
    # A derived image exists only on the nodes (`ucmctl image build`): never pulled.
    run.append(f"--pull={'never' if spec.derived else spec.pull}")
    if spec.user:
        run.append(f"--user={spec.user}")
    run.append(f"--workdir={workdir}")
    run += volumes
    run += card_options
    run += [f"--device={d}" for d in spec.devices]
    run += [f"--env={k}={v}" for k, v in inside.items()]
    run += spec.options
    run.append(image)
    run += argv
    plan = ContainerPlan(
        runtime=runtime,
        image=image,
        base_image=spec.image,
        derived=spec.derived,
        python=spec.python,
        name=name,
        labels=labels,
        pull=spec.pull,
        devices=card_nodes + list(spec.devices),
        argv=run,
    )
    return plan, inside


def pyxis_plan(
    spec: Container, *, deployment: str, process: str, workdir: str, mounts: list[Mount]
) -> ContainerPlan:
    """A Slurm job step in the image (pyxis): the options its srun adds. The step runs the
    process's launch script inside (it sets the environment); enroot shares the node's network,
    IPC and process ids, so the process is found by its pidfile as a bare one is; Slurm's GRES
    gives the step its cards."""
    assert spec.runtime == "pyxis" and spec.image is not None
    seen: set[str] = set()
    options: list[str] = []
    for m in [*mounts, *spec.mounts]:
        if m.container not in seen:
            seen.add(m.container)
            options.append(m.option())
    argv = [f"--container-image={spec.image}", "--container-mounts=" + ",".join(options),
            f"--container-workdir={workdir}", "--no-container-mount-home"]  # fmt: skip
    return ContainerPlan(
        runtime="pyxis",
        image=spec.image,
        base_image=spec.image,
        derived=False,
        python=spec.python,
        name=container_name(deployment, process),
        labels={},
        pull="missing",
        devices=[],
        argv=argv,
    )


def work_mounts(work: str, model: str | None, backends: list[str]) -> list[Mount]:
    """The node's folders a process needs at the same paths: its run folder, a server's model
    folder (read-only; a hub id is no folder), and the store's backends."""
    mounts = [Mount(host=work, container=work)]
    if model is not None and posixpath.isabs(model):
        mounts.append(Mount(host=model, container=model, read_only=True))
    mounts += [Mount(host=b, container=b) for b in backends]
    return mounts
