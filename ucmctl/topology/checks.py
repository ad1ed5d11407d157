"""The guides' pitfalls that can be seen in the YAML alone, checked before anything runs."""

from __future__ import annotations

import re
from pathlib import Path

from ucmctl.core.errors import Problem
from ucmctl.core.platforms import ALL_DEVICE_VARIABLES, DEVICE_VARIABLE
from ucmctl.core.ucm_config import PIPELINES, UcmConfigError, parse_store_config
from ucmctl.engines import engine_for
from ucmctl.engines.mooncake import PLATFORM_PROTOCOLS, VLLM_MOONCAKE, connector_for, protocol_for
from ucmctl.topology.model import (
    ENV_NAME_RE,
    FLAG_NAME_RE,
    NAME_RE,
    DpMode,
    Mode,
    Platform,
    SlurmCluster,
    Storage,
    Topology,
    Transport,
)
from ucmctl.topology.placement_checks import check_placement, check_proxy_places
from ucmctl.topology.source import KeyPath, Source

# The UCM config's pipelines (ucmctl.core.ucm_config, the one schema of that file) that share blocks
# between instances: those with the shared Posix tier.
DEPLOYABLE_PIPELINES = tuple(p for p in PIPELINES if "Posix" in p.split("|"))
UNSAFE_TEXT = re.compile(r"[\x00-\x1f\x7f]")


def check_topology(t: Topology, src: Source, base_dir: Path | None = None) -> list[Problem]:
    """Every problem found, in file order; an empty list means the topology can be planned."""
    problems: list[Problem] = []

    def bad(path: KeyPath, message: str, fix: str | None = None) -> None:
        problems.append(src.problem(path, message, fix))

    _check_nodes(t, bad)
    _check_sides(t, bad)
    _check_services(t, bad)
    _check_storage(t, bad)
    _check_consistency(t, bad)
    _check_env_and_flags(t, bad)
    _check_paths(t, bad)
    _check_containers(t, bad)
    if not problems:  # placement needs valid node references
        check_placement(t, bad)
    problems.sort(key=lambda p: p.line or 0)
    return problems


def _check_containers(t: Topology, bad) -> None:
    """podman and docker run over SSH (or on this machine); on Slurm each job step runs in its
    image through pyxis, or in an OCI bundle through Slurm's own container support."""
    slurm = isinstance(t.cluster, SlurmCluster)
    places: list[tuple[tuple[str, ...], str]] = [
        (("nodes", n), node.container.runtime) for n, node in t.nodes.items()
    ]
    places += [((role,), side.container.runtime) for role, side in t.sides() if side.container is not None]
    for path, runtime in places:
        if slurm and runtime in ("podman", "docker"):
            bad(
                (*path, "container", "runtime"),
                f"on Slurm a job step runs in its image through pyxis or oci, not {runtime}",
                fix="set runtime pyxis (srun --container-image) or oci (srun --container), or use "
                "cluster kind ssh",
            )
        elif not slurm and runtime in ("pyxis", "oci"):
            bad(
                (*path, "container", "runtime"),
                f"{runtime} runs Slurm job steps: it needs cluster kind slurm",
                fix="set runtime podman or docker, or cluster: {kind: slurm}",
            )


def _check_nodes(t: Topology, bad) -> None:
    seen_hosts: dict[str, str] = {}
    for name, node in t.nodes.items():
        if not re.fullmatch(NAME_RE, name):
            bad(
                ("nodes", name),
                f"node name {name!r} is not allowed",
                "use lowercase letters, digits, '-', '_' or '.'",
            )
        chosen = isinstance(t.cluster, SlurmCluster) and t.cluster.choose_nodes
        if chosen and node.host:
            bad(
                ("nodes", name, "host"),
                "Slurm chooses this node (cluster.choose_nodes): its address comes from Slurm",
                "remove `host`, or drop choose_nodes and name Slurm's nodes",
            )
        if not chosen and not node.host:
            bad(
                ("nodes", name),
                "the node has no `host`",
                "add `host:` (the address the control machine reaches it at)",
            )
        if not node.host:
            continue
        if node.host in seen_hosts:
            bad(
                ("nodes", name, "host"),
                f"host {node.host} is already node {seen_hosts[node.host]!r}",
                "describe each machine once and place several servers on it",
            )
        seen_hosts.setdefault(node.host, name)
        if node.transport is Transport.local and node.host not in ("localhost", "127.0.0.1", "::1"):
            bad(("nodes", name, "host"), "a local node must have host localhost or 127.0.0.1")
    local = [n for n, node in t.nodes.items() if node.transport is Transport.local]
    if t.cluster.kind == "slurm" and local:
        bad(
            ("nodes", local[0], "transport"),
            "a Slurm deployment runs every process as a job step",
            "remove `transport: local`: name the Slurm node and give its address as `host`",
        )
    if len(local) > 1:
        bad(("nodes", local[1], "transport"), "only one node can be local (this machine)")
    with_systemd = [n for n, node in t.nodes.items() if node.systemd]
    if t.cluster.kind == "slurm" and with_systemd:
        bad(
            ("nodes", with_systemd[0], "systemd"),
            "on Slurm every process is a job step, not a systemd unit",
            "remove `systemd: true`: ucmctl's supervisor restarts a step's process",
        )


def _check_sides(t: Topology, bad) -> None:
    if t.mode is Mode.mixed:
        if t.mixed is None:
            bad(("mode",), "mode mixed needs a 'mixed' section", "add mixed: {nodes: [...], ...}")
        for extra in ("prefill", "decode"):
            if getattr(t, extra) is not None:
                bad(
                    (extra,),
                    f"mode mixed has no {extra!r} side",
                    "use 'mixed' or mode centralized/p2p",
                )
    else:
        for needed in ("prefill", "decode"):
            if getattr(t, needed) is None:
                bad(("mode",), f"mode {t.mode.value} needs a {needed!r} section")
        if t.mixed is not None:
            bad(("mixed",), f"'mixed' is only used with mode mixed (mode is {t.mode.value})")
    for side_name, side in t.sides():
        seen: set[str] = set()
        for i, node_name in enumerate(side.nodes):
            if node_name not in t.nodes:
                bad(
                    (side_name, "nodes", i),
                    f"unknown node {node_name!r}",
                    f"defined nodes: {', '.join(t.nodes)}",
                )
            if node_name in seen:
                bad(
                    (side_name, "nodes", i),
                    f"node {node_name!r} is listed twice",
                    "use servers_per_node for several servers on one node",
                )
            seen.add(node_name)
        if isinstance(side.servers_per_node, dict):
            for node_name in side.servers_per_node:
                if node_name not in side.nodes:
                    bad(
                        (side_name, "servers_per_node", node_name),
                        f"{node_name!r} is not one of {side_name}.nodes",
                        f"count servers only for {', '.join(side.nodes)}",
                    )
            for i, node_name in enumerate(side.nodes):
                if node_name not in side.servers_per_node:
                    bad((side_name, "nodes", i), f"no servers_per_node count for {node_name!r}")
        servers = side.server_count()
        if side.dp > 1 and side.dp_mode is DpMode.external and servers % side.dp:
            bad(
                (side_name, "dp"),
                f"{servers} API servers on {len(side.nodes)} nodes cannot be split into "
                f"DP groups of {side.dp}",
                "make the number of servers a multiple of dp",
            )
        if side.dp > 1 and side.dp_mode is DpMode.internal and any(c != 1 for _, c in side.placement()):
            bad(
                (side_name, "servers_per_node"),
                "internal DP runs every rank in one server per node",
                "set servers_per_node: 1",
            )
        if side.kv_peer is not None and t.mode is not Mode.p2p:
            bad((side_name, "kv_peer"), "kv_peer is only used in p2p mode")


def _check_mooncake_connectors(t: Topology, bad) -> None:
    """Every P2P node has a connector ucmctl can render, one connector on both sides, and a
    protocol that connector and the node's hardware can both carry."""
    mc = t.mooncake
    assert mc is not None
    used: dict[str, tuple[str, str, int]] = {}  # connector name -> where it was first seen
    for side_name, side in t.sides():
        for i, n in enumerate(side.nodes):
            node = t.nodes.get(n)
            if node is None:
                continue
            facts = connector_for(node.platform, mc.connector)
            if facts is None:
                bad(
                    (side_name, "nodes", i),
                    f"node {n!r} is {node.platform.value}, which has no known Mooncake P2P connector",
                    "use mode centralized, or set mooncake.connector to MooncakeConnector or "
                    "MooncakeConnectorV1",
                )
                continue
            used.setdefault(facts.name, (side_name, n, i))
            protocol = protocol_for(node.platform, facts, mc.protocol)
            hardware = PLATFORM_PROTOCOLS.get(node.platform, facts.protocols)
            usable = [p for p in facts.protocols if p in hardware]
            if protocol not in usable:
                bad(
                    ("mooncake", "protocol"),
                    f"protocol {protocol!r} cannot be used by {facts.name} on node {n!r} "
                    f"({node.platform.value})",
                    f"use {' or '.join(usable)}" if usable else "use mode centralized",
                )
    prefill = t.prefill
    if (
        prefill is not None
        and VLLM_MOONCAKE.name in used
        and prefill.dp > 1
        and prefill.dp_mode is DpMode.internal
    ):
        bad(
            ("prefill", "dp_mode"),
            f"prefill runs DP{prefill.dp} behind one API server, but the router must know which DP "
            "rank's engine holds a request's KV (vLLM's MooncakeConnector)",
            "set prefill.dp_mode: external (one API server per DP rank)",
        )
    if len(used) > 1:
        (a, (_, na, _)), (b, (side_b, nb, ib)) = list(used.items())[:2]
        bad(
            (side_b, "nodes", ib),
            f"node {nb!r} would run {b} but node {na!r} runs {a}: the two cannot exchange KV",
            "use one platform family for P2P, or mode centralized (KV through the shared store)",
        )


def _check_services(t: Topology, bad) -> None:
    if t.mode is Mode.p2p and t.mooncake is None:
        bad(("mode",), "p2p mode needs a 'mooncake' section", "add mooncake: {master_node: <node>}")
    if t.mooncake is not None:
        if t.mode is not Mode.p2p:
            bad(("mooncake",), f"Mooncake is only used in p2p mode (mode is {t.mode.value})")
        if t.mooncake.master_node not in t.nodes:
            bad(
                ("mooncake", "master_node"),
                f"unknown node {t.mooncake.master_node!r}",
                f"defined nodes: {', '.join(t.nodes)}",
            )
        elif t.mode is Mode.p2p:
            _check_mooncake_connectors(t, bad)
    if t.proxy is None:
        if t.mode is not Mode.mixed:
            bad(
                ("mode",),
                "PD disaggregation needs a proxy to pair prefill and decode",
                "add proxy: {node: <node>, port: <port>}",
            )
    else:
        check_proxy_places(t, bad)
    if t.proxy is not None and t.proxy.roles == "dynamic" and t.mode is not Mode.centralized:
        bad(
            ("proxy", "roles"),
            f"dynamic roles send either leg to any API server, which needs the store's KV between them: "
            f"mode {t.mode.value} has no prefill and decode sharing it",
            "drop roles: dynamic, or use mode centralized",
        )
    if t.proxy is not None and t.proxy.direct_below and t.mode is not Mode.centralized:
        bad(
            ("proxy", "direct_below"),
            f"direct_below sends a request to a decode instance alone, which needs the store's KV: "
            f"mode {t.mode.value} has no prefill and decode sharing it",
            "drop direct_below, or use mode centralized",
        )


def _check_storage(t: Topology, bad) -> None:
    s = t.storage
    if s is None:
        return
    found: list[KeyPath] = []

    def bad_storage(path: KeyPath, message: str, fix: str | None = None) -> None:
        found.append(path)
        bad(path, message, fix)

    _check_storage_keys(s, bad_storage)
    if not found:  # what the keys' own checks let through, the UCM config's schema judges too
        try:
            parse_store_config(s.ucm_store_values(), prefix="storage")
        except UcmConfigError as exc:
            where, _, message = str(exc).partition(": ")
            key = where.split(".")[1] if "." in where else None
            bad(("storage", key) if key else ("storage",), message)


def _check_storage_keys(s: Storage, bad) -> None:
    if s.store_pipeline not in DEPLOYABLE_PIPELINES:
        known = s.store_pipeline in PIPELINES
        bad(
            ("storage", "store_pipeline"),
            f"store pipeline {s.store_pipeline!r} keeps blocks in one instance's memory"
            if known
            else f"unknown store pipeline {s.store_pipeline!r}",
            f"valid: {', '.join(DEPLOYABLE_PIPELINES)} (a deployment shares blocks through the Posix tier)",
        )
    elif s.cache_buffer_capacity_gb <= 0:  # the store refuses 0 even when Cache is not used
        bad(("storage", "cache_buffer_capacity_gb"), "the store needs a DRAM capacity above 0")
    seen: set[str] = set()
    for i, path in enumerate(s.storage_backends):
        if not path.startswith("/"):
            bad(
                ("storage", "storage_backends", i),
                f"storage backend {path!r} is not an absolute path",
                "use the absolute path of the shared mount, e.g. /mnt/ucm",
            )
        elif UNSAFE_TEXT.search(path) or "/../" in f"{path}/":
            bad(("storage", "storage_backends", i), f"storage backend {path!r} is not a plain path")
        elif ":" in path:  # ucm_config.yaml joins the backends with ':' and the store splits there
            bad(
                ("storage", "storage_backends", i),
                f"storage backend {path!r} holds ':', which separates backends",
                "mount or link the directory at a path without ':'",
            )
        if path in seen:
            bad(("storage", "storage_backends", i), f"storage backend {path!r} is listed twice")
        seen.add(path)


def _check_consistency(t: Topology, bad) -> None:
    # dtype: every instance sharing KV must compute it in the same precision.
    dtypes = {role: side.dtype or t.model.dtype for role, side in t.sides()}
    if len(set(dtypes.values())) > 1:
        first = next(iter(dtypes))
        for role, dtype in dtypes.items():
            if dtype != dtypes[first]:
                bad(
                    (role, "dtype"),
                    f"dtype {dtype} differs from {first}'s {dtypes[first]}: KV bytes would not match",
                    "use one dtype on every instance (set model.dtype, drop the side overrides)",
                )
    # PYTHONHASHSEED: block hashes must agree between every instance that shares the store.
    wanted = str(t.model.hash_seed)
    for name, node in t.nodes.items():
        if "PYTHONHASHSEED" in node.env and node.env["PYTHONHASHSEED"] != wanted:
            bad(
                ("nodes", name, "env", "PYTHONHASHSEED"),
                f"PYTHONHASHSEED {node.env['PYTHONHASHSEED']} differs from model.hash_seed {wanted}",
                "set model.hash_seed only; every instance must hash blocks alike",
            )
    for side_name, side in t.sides():
        if "PYTHONHASHSEED" in side.env and side.env["PYTHONHASHSEED"] != wanted:
            bad(
                (side_name, "env", "PYTHONHASHSEED"),
                f"PYTHONHASHSEED {side.env['PYTHONHASHSEED']} differs from model.hash_seed {wanted}",
                "set model.hash_seed only; every instance must hash blocks alike",
            )
    # Mooncake: the prefill config's decode section must be the decode side's parallelism.
    if t.mode is Mode.p2p and t.prefill is not None and t.decode is not None:
        for side_name, side, peer_name, peer in (
            ("prefill", t.prefill, "decode", t.decode),
            ("decode", t.decode, "prefill", t.prefill),
        ):
            if side.kv_peer and (side.kv_peer.dp, side.kv_peer.tp) != (peer.dp, peer.tp):
                bad(
                    (side_name, "kv_peer"),
                    f"kv_peer says {peer_name} is DP{side.kv_peer.dp}xTP{side.kv_peer.tp} but the "
                    f"{peer_name} side is DP{peer.dp}xTP{peer.tp}",
                    f"the {peer_name} section of the Mooncake config must be the {peer_name} side's "
                    "dp/tp; remove kv_peer to derive it",
                )


def _check_env_and_flags(t: Topology, bad) -> None:
    engine = engine_for(t.engine.value)  # what it manages: set by ucmctl, never by the topology

    def env_block(path: KeyPath, env: dict[str, str], platforms: set[Platform]) -> None:
        for key, value in env.items():
            if not ENV_NAME_RE.fullmatch(key):
                bad((*path, key), f"{key!r} is not a valid environment variable name")
            if UNSAFE_TEXT.search(value):
                bad((*path, key), "environment values cannot hold control characters or newlines")
            if key in engine.managed_env:
                bad((*path, key), f"{key} is set by ucmctl", f"use {engine.managed_env[key]}")
            if key in ALL_DEVICE_VARIABLES:
                right = {DEVICE_VARIABLE[p] for p in platforms} - {None}
                if key not in right and right:
                    names = " / ".join(sorted(p.value for p in platforms))
                    bad(
                        (*path, key),
                        f"{names} uses {', '.join(sorted(r for r in right if r))}, not {key}",
                        "remove it: ucmctl sets the right variable from the device allocation",
                    )
                else:
                    bad(
                        (*path, key),
                        f"{key} is set by ucmctl from the device allocation",
                        "remove it; choose cards with <side>.servers_per_node, tp and nodes.<n>.devices",
                    )

    for name, node in t.nodes.items():
        env_block(("nodes", name, "env"), node.env, {node.platform})
    for side_name, side in t.sides():
        platforms = {t.nodes[n].platform for n in side.nodes if n in t.nodes}
        env_block((side_name, "env"), side.env, platforms)
        for flag, value in side.flags.items():
            path = (side_name, "flags", flag)
            bare = flag[2:] if flag.startswith("--") else flag
            normal = bare.replace("_", "-")
            if (flag.startswith("-") and not flag.startswith("--")) or not FLAG_NAME_RE.fullmatch(bare):
                bad(
                    path,
                    f"{flag!r} is not a vLLM flag name",
                    "write it without dashes, e.g. max-model-len",
                )
            elif normal in engine.managed_flags:
                bad(path, f"--{normal} is set by ucmctl", f"use {engine.managed_flags[normal]}")
            if isinstance(value, str) and UNSAFE_TEXT.search(value):
                bad(path, "flag values cannot hold control characters or newlines")


def _check_paths(t: Topology, bad) -> None:
    local_only = all(n.transport is Transport.local for n in t.nodes.values())
    path = t.model.path
    if UNSAFE_TEXT.search(path) or not path:
        bad(("model", "path"), "the model path must be plain text on one line")
    elif path.startswith("-"):  # `vllm serve -x` would read it as an option
        bad(("model", "path"), f"model path {path!r} starts with '-'", "use ./ or an absolute path")
    elif path.startswith(("./", "../")) and not local_only:
        bad(
            ("model", "path"),
            "a relative model path only works on a local topology",
            "use the model's absolute path on the nodes",
        )
    served = t.model.served_name
    if served is not None and (not served or served.startswith("-")):
        # --served-model-name takes several names: `-x` would end the list as an option.
        bad(("model", "served_name"), f"served_name {served!r} is empty or starts with '-'")
    for name, node in t.nodes.items():
        for key in ("python", "venv", "workdir", "key"):
            value = getattr(node, key)
            if value is None:
                continue
            if UNSAFE_TEXT.search(value) or not value:
                bad(("nodes", name, key), f"{key} must be plain text on one line")
            elif key in ("venv", "workdir") and not value.startswith("/"):
                bad(("nodes", name, key), f"{key} {value!r} is not an absolute path")
            elif key == "python" and "/" in value and not value.startswith("/"):
                bad(
                    ("nodes", name, key),
                    f"python {value!r} must be a command name or an absolute path",
                )
