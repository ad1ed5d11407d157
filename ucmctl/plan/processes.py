"""Where a planned process runs and how it starts: the node's tools and addresses, its launch
script (bare, in a container, or in a Slurm job step), and what restarts it on failure."""

from __future__ import annotations

import ipaddress
import posixpath
from typing import Any, Literal

from ucmctl.core.names import SERVER_ROLES
from ucmctl.core.ucm_config import StoreConfig
from ucmctl.plan.containers import container_plan, oci_plan, pyxis_plan, work_mounts
from ucmctl.plan.model import (
    ContainerPlan,
    NodePlan,
    PlacedFile,
    Process,
    RestartPlan,
    Role,
    Stage,
    default_health_timeout,
    process_marker,
)
from ucmctl.plan.render import render
from ucmctl.topology.container import Container, Mount
from ucmctl.topology.fields import Restart
from ucmctl.topology.model import Mode, Node, Storage, Topology, Transport

LOCAL_ADDRESS = "127.0.0.1"


def side_uses_store(t: Topology, side: str) -> bool:
    """Whether a server of `side` loads the UCM connector: every one when there is storage, but
    P2P decode (it gets its KV from prefill through Mooncake)."""
    return t.storage is not None and not (t.mode is Mode.p2p and side == "decode")


def store_backends(storage: Storage) -> list[str]:
    return StoreConfig.model_validate(storage.ucm_store_values()).storage_backends


def python_of(node: Node, container: Container | None = None) -> str:
    if container is not None and container.contained:
        return container.python
    return f"{node.venv}/bin/python" if node.venv else node.python


def tool_path(node: Node, name: str, container: Container | None = None) -> str:
    """A console script next to the node's Python (or on PATH when Python is a bare command);
    in a container, on the image's PATH."""
    if container is not None and container.contained:
        return name
    if node.venv:
        return f"{node.venv}/bin/{name}"
    if node.python.startswith("/"):
        return posixpath.join(posixpath.dirname(node.python), name)
    return name


def reach_address(node: Node) -> str:
    """Where others reach the node's listeners: the address they bind, when the topology names
    one (nothing else answers then), else the node's host."""
    if node.bind is not None and not ipaddress.ip_address(node.bind).is_unspecified:
        return node.bind
    return LOCAL_ADDRESS if node.transport is Transport.local else node.host


def bind_address(node: Node) -> str:
    """What every listener on the node binds: the topology's `bind`, else the address the node is
    reached at, never every interface unless the topology asks for it."""
    if node.bind is not None:
        return node.bind
    return LOCAL_ADDRESS if node.transport is Transport.local else node.host


def place_process(
    t: Topology,
    nodes: dict[str, NodePlan],
    *,
    name: str,
    role: Role,
    node: str,
    stage: Stage,
    argv: list[str],
    env: dict[str, str],
    extra_files: dict[str, str],
    container: Container,
    cache_dirs: list[str] | None = None,
    restart: Restart | None = None,
    **fields: Any,
) -> Process:
    work = posixpath.join(nodes[node].run_dir, name)
    on_failure = restart is not None and restart.on
    files = [PlacedFile(path=posixpath.join(work, f), content=c) for f, c in extra_files.items()]
    launch = posixpath.join(work, "launch.sh")
    pidfile, log = posixpath.join(work, "pid"), posixpath.join(work, "output.log")
    contained = None
    uses_store = t.storage is not None and role in SERVER_ROLES and side_uses_store(t, role)
    backends = store_backends(t.storage) if t.storage is not None and uses_store else []
    mounts = work_mounts(work, t.model.path if role in SERVER_ROLES else None, backends)
    mounts += [Mount(host=d, container=d) for d in cache_dirs or []]
    if container.detached:
        contained, env = container_plan(
            container,
            deployment=t.name,
            process=name,
            topology_digest=t.digest(),
            platform=t.nodes[node].platform,
            argv=argv,
            env=env,
            cards=list(fields.get("devices", [])),
            device_variable=fields.get("device_variable"),
            workdir=work,
            mounts=mounts,
            max_restarts=restart.max_restarts if restart is not None and on_failure else None,
        )
        options = contained.argv[: len(contained.argv) - len(argv) - 1]
        script = render(
            "container.sh.j2",
            deployment=t.name,
            process=name,
            container=contained,
            options=options,
            command=argv,
            make_dirs=cache_dirs or [],
        )
    else:
        contained = _step_container(t, nodes[node], container, name=name, work=work, mounts=mounts)
        script = render("launch.sh.j2", deployment=t.name, process=name, workdir=work, env=env, argv=argv)
    files.append(PlacedFile(path=launch, content=script, mode=0o755))
    planned = None
    if restart is not None and on_failure:
        planned, launch = restart_plan(
            t.name, name, work, launch, restart, contained, systemd=nodes[node].systemd, files=files
        )
    return Process(
        name=name,
        role=role,
        node=node,
        stage=stage,
        argv=argv,
        env=env,
        launch=launch,
        files=files,
        log=log,
        pidfile=pidfile,
        health_timeout=default_health_timeout(role, t.engine.value),
        container=contained,
        restart=planned,
        **fields,
    )


def _step_container(
    t: Topology, node: NodePlan, container: Container, *, name: str, work: str, mounts: list[Mount]
) -> ContainerPlan | None:
    """What a launch script that is not a detached container runs in: None when bare."""
    if container.runtime == "pyxis":  # a Slurm job step in the image: the launch script runs inside
        return pyxis_plan(container, deployment=t.name, process=name, workdir=work, mounts=mounts)
    if container.runtime == "oci":  # ... or in an OCI bundle: one a node's processes share
        every = store_backends(t.storage) if t.storage else []
        return oci_plan(
            container,
            deployment=t.name,
            process=name,
            run_dir=node.run_dir,
            model=t.model.path,
            backends=every,
        )
    return None


def restart_plan(
    deployment: str,
    name: str,
    work: str,
    launch: str,
    restart: Restart,
    contained: ContainerPlan | None,
    *,
    systemd: bool,
    files: list[PlacedFile],
) -> tuple[RestartPlan, str]:
    """What restarts the process `name` on failure, and the script its node starts: a podman or
    docker container restarts itself; on a systemd node a transient unit runs the launch script;
    else ucmctl's supervisor does (what a Slurm step or the node starts). The scripts this takes
    are added to `files`."""
    pidfile, log = posixpath.join(work, "pid"), posixpath.join(work, "output.log")
    if contained is not None and contained.runtime in ("podman", "docker"):
        runtime: Literal["podman", "docker"] = "podman" if contained.runtime == "podman" else "docker"
        return RestartPlan(by=runtime, max_restarts=restart.max_restarts, backoff_s=None), launch
    if systemd and contained is None:  # a transient unit runs the launch script
        unit_script = posixpath.join(work, "unit.sh")
        planned = RestartPlan(
            by="systemd", max_restarts=restart.max_restarts, backoff_s=restart.backoff_s, script=unit_script
        )
        script = render(
            "unit.sh.j2",
            deployment=deployment,
            process=name,
            launch=launch,
            pidfile=pidfile,
            log=log,
            marker=process_marker(name, launch),
        )
        files.append(PlacedFile(path=unit_script, content=script, mode=0o755))
        return planned, launch
    state = posixpath.join(work, "restarts")
    planned = RestartPlan(
        by="supervisor", max_restarts=restart.max_restarts, backoff_s=restart.backoff_s, state=state
    )
    supervise = posixpath.join(work, "supervise.sh")
    script = render(
        "supervise.sh.j2",
        deployment=deployment,
        process=name,
        launch=launch,
        state=state,
        max_restarts=restart.max_restarts,
        backoff_s=f"{restart.backoff_s:g}",
    )
    files.append(PlacedFile(path=supervise, content=script, mode=0o755))
    return planned, supervise
