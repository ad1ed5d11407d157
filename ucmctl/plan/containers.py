"""A process in a container: the runtime's exact command line, computed with the rest of the plan.

Every container runs detached with an init process (so a stop is prompt), on the node's network
(`--network host`: its servers answer on the node's addresses, as bare ones do), with labels that
name the deployment, the process and the topology's digest, under a name made of them. It sees
the node's folders it needs at the same paths (the model, the store's backends, its own run
folder) and only its own cards: the visible-devices variable counts them as the container sees
them.
"""

from __future__ import annotations

import copy
import hashlib
import json
import posixpath
import re
from typing import Any

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
    max_restarts: int | None = None,
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
    if max_restarts is not None:  # the topology's restart: on-failure, by the runtime itself
        run.append(f"--restart=on-failure:{max_restarts}")
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


def step_mounts(mounts: list[Mount]) -> list[str]:
    """A job step's mount options, the first of each container path (the plan's before the user's)."""
    seen: set[str] = set()
    options: list[str] = []
    for m in mounts:
        if m.container not in seen:
            seen.add(m.container)
            options.append(m.option())
    return options


def pyxis_plan(
    spec: Container, *, deployment: str, process: str, workdir: str, mounts: list[Mount]
) -> ContainerPlan:
    """A Slurm job step in the image (pyxis): the options its srun adds. The step runs the
    process's launch script inside (it sets the environment); enroot shares the node's network,
    IPC and process ids, so the process is found by its pidfile as a bare one is; Slurm's GRES
    gives the step its cards."""
    assert spec.runtime == "pyxis" and spec.image is not None
    options = step_mounts([*mounts, *spec.mounts])
    argv = [
        f"--container-image={spec.image}",
        "--container-mounts=" + ",".join(options),
        f"--container-workdir={workdir}",
        "--no-container-mount-home",
    ]
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


# ucmctl's wheel in a derived OCI bundle: a folder of its own in the bundle's rootfs, on PYTHONPATH.
BUNDLE_SITE = "/opt/ucmctl/site-packages"
# The namespaces a bundle's job step shares with the node, as pyxis's do: its network (the servers
# answer on the node's addresses), process ids (ucmctl finds and stops a process by its pidfile),
# IPC (the Cache tier's shared memory) and host name.
SHARED_NAMESPACES = ("network", "pid", "ipc", "uts")


def oci_bundle(base: str, mounts: list[str], derived: bool) -> str:
    """The bundle `ucmctl image build` makes beside `base` for a node: its rootfs (hard links of
    the base's, plus ucmctl's wheel when `derived`) and a config.json with the plan's mounts. Its
    name carries a digest of those, so two plans that need the same bundle share it."""
    key = json.dumps({"mounts": mounts, "derived": derived}, sort_keys=True).encode()
    return f"{base.rstrip('/')}.ucmctl-{hashlib.sha256(key).hexdigest()[:12]}"


def oci_plan(
    spec: Container, *, deployment: str, process: str, run_dir: str, model: str | None, backends: list[str]
) -> ContainerPlan:
    """A Slurm job step in an OCI bundle (`srun --container`, Slurm's own container support).
    Slurm reads the mounts from the bundle's config.json only (and 22.05 takes the bundle's own
    rootfs/), so a node's processes share one bundle ucmctl derives from the topology's: it mounts
    the node's run folder (every process's own), the model, the store's backends and the
    topology's mounts, and shares the node's network, process ids and IPC, so the step runs the
    launch script inside and the process is found by its pidfile as a bare one is."""
    assert spec.runtime == "oci" and spec.image is not None
    mounts = [Mount(host=run_dir, container=run_dir)]
    if model is not None and posixpath.isabs(model):
        mounts.append(Mount(host=model, container=model, read_only=True))
    mounts += [Mount(host=b, container=b) for b in backends]
    options = step_mounts([*mounts, *spec.mounts])
    bundle = oci_bundle(spec.image, options, spec.derived)
    return ContainerPlan(
        runtime="oci",
        image=bundle,
        base_image=spec.image,
        derived=spec.derived,
        python=spec.python,
        name=container_name(deployment, process),
        labels={},
        pull="never",
        devices=[],
        argv=[f"--container={bundle}"],
        mounts=options,
    )


def bundle_config(base: dict[str, Any], mounts: list[str], derived: bool) -> dict[str, Any]:
    """The config.json of a derived OCI bundle from its base's: the rootfs beside it, the node's
    network, process ids, IPC and host name, the plan's bind mounts over the base's (a base mount of
    the same path gives way), ucmctl's wheel on PYTHONPATH when `derived`."""
    config = copy.deepcopy(base)
    config["root"] = {**config.get("root", {}), "path": "rootfs"}
    linux = config.setdefault("linux", {})
    linux["namespaces"] = [n for n in linux.get("namespaces", []) if n.get("type") not in SHARED_NAMESPACES]
    config.pop("hostname", None)  # a host name needs a UTS namespace of its own
    ours = []
    for option in mounts:
        parts = option.split(":")
        mode = parts.pop() if len(parts) == 3 else "rw"
        ours.append({"destination": parts[1], "type": "bind", "source": parts[0], "options": ["rbind", mode]})
    taken = {m["destination"] for m in ours}
    config["mounts"] = [m for m in config.get("mounts", []) if m.get("destination") not in taken] + ours
    if derived:
        process = config.setdefault("process", {})
        env = [e for e in process.get("env", []) if not e.startswith("PYTHONPATH=")]
        old = next((e.split("=", 1)[1] for e in process.get("env", []) if e.startswith("PYTHONPATH=")), "")
        process["env"] = [*env, f"PYTHONPATH={BUNDLE_SITE}" + (f":{old}" if old else "")]
    return config


def work_mounts(work: str, model: str | None, backends: list[str]) -> list[Mount]:
    """The node's folders a process needs at the same paths: its run folder, a server's model
    folder (read-only; a hub id is no folder), and the store's backends."""
    mounts = [Mount(host=work, container=work)]
    if model is not None and posixpath.isabs(model):
        mounts.append(Mount(host=model, container=model, read_only=True))
    mounts += [Mount(host=b, container=b) for b in backends]
    return mounts
