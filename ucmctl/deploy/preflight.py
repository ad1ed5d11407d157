"""Checks on every node, in parallel, before anything starts: each failure is one line."""

from __future__ import annotations

import ipaddress
import shlex
from dataclasses import dataclass, field

from ucmctl.core.platforms import DEVICE_COUNTER, Platform
from ucmctl.deploy import filesystems
from ucmctl.deploy.container_preflight import bundle_problems, container_problems
from ucmctl.deploy.starting import LISTENING
from ucmctl.deploy.storage_preflight import SharedCheck
from ucmctl.engines import engine_for
from ucmctl.nodes import lifecycle
from ucmctl.nodes.executor import Executor, HostKeyError, NodeError
from ucmctl.nodes.fanout import parallel
from ucmctl.plan.model import NodePlan, Plan, Process

# One round trip per node: facts as KEY=VALUE lines.
_FACTS = r"""
PY={python}
$PY -c '{python_probe}' 2>/dev/null
echo "nvidia=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')"
echo "npu=$(npu-smi info -l 2>/dev/null | awk -F: '/Total Count/ {{gsub(/ /, "", $2); print $2}}')"
echo "cpus=$(nproc 2>/dev/null)"
echo "shm_kb=$(df -Pk /dev/shm 2>/dev/null | awk 'NR==2 {{print $4}}')"
echo "mem_kb=$(awk '/MemAvailable/ {{print $2}}' /proc/meminfo 2>/dev/null)"
echo "listening=$({listening} | tr '\n' ,)"
echo "mooncake=$(command -v {mooncake} >/dev/null 2>&1 && echo 1 || echo 0)"
echo "bind_ip=$(getent ahosts {bind} 2>/dev/null | awk 'NR==1 {{print $1}}')"
echo "addresses=$(hostname -I 2>/dev/null)"
echo "device_model=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n 1)"
echo "cpu_model=$(awk -F': ' '/^model name/ {{print $2; exit}}' /proc/cpuinfo 2>/dev/null)"
"""

# Whether systemd can restart this user's processes here (`units=ok`), else why not.
_UNITS = r"""
if [ ! -d /run/systemd/system ]; then echo "units=systemd is not the node's init (no /run/systemd/system)"
elif ! command -v systemd-run >/dev/null 2>&1; then echo "units=systemd-run is not installed"
elif [ "$(id -u)" = 0 ] || systemctl --user show-environment >/dev/null 2>&1; then echo "units=ok"
else echo "units=$(id -un) has no systemd user manager: run \`loginctl enable-linger $(id -un)\` as root"
fi
"""

# One interpreter start for all three facts: Python's version, the engine's, the connector.
_PYTHON_PROBE = """
import sys, importlib.util as u
print("python=%d.%d.%d" % sys.version_info[:3])
try:
    {engine}
except Exception:
    print("engine=")
print("connector=%d" % all(u.find_spec(m) is not None for m in ("ucm_connector", "ucm_store")))
try:
    import importlib.metadata as m
    print("torch=" + m.version("torch"))
except Exception:
    print("torch=")
"""
# What a node's facts tell of where a benchmark ran (its provenance; the record keeps them).
PROVENANCE_FACTS = ("python", "engine", "torch", "device_model", "cpu_model")
# The fact (a line of _FACTS) each device-counting tool fills in.
_COUNTED_BY = {"nvidia-smi": "nvidia", "npu-smi": "npu"}


@dataclass
class NodeFacts:
    node: str
    facts: dict[str, str] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    running: list[str] = field(default_factory=list)  # this deployment's processes still up there
    warnings: list[str] = field(default_factory=list)  # what works, but not as well as it could


@dataclass
class Preflight:
    problems: list[str]
    # Per node, shell commands for the staging round trip: the shared-storage markers to remove.
    cleanup: dict[str, list[str]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)  # what was found: each backend's filesystem
    warnings: list[str] = field(default_factory=list)  # what only costs speed
    # Per node, what a result's provenance says of it: versions, device model, image ids.
    facts: dict[str, dict[str, str]] = field(default_factory=dict)


def preflight(
    plan: Plan, executors: dict[str, Executor], restarting: frozenset[str] = frozenset()
) -> Preflight:
    """Every problem found on every node (none: ready to start), one round trip per node plus,
    with several storage nodes, one more on each of the others to read the first one's marker.
    Reads the Plan alone. The processes named in `restarting` run now and are to be started
    again with this plan (a server a changed topology moves): that they run is no problem."""
    shared = SharedCheck(plan)
    results = parallel(executors, lambda n: _node_checks(plan, executors[n], shared))
    for r in results:
        r.running = [name for name in r.running if name not in restarting]
    problems = [p for r in results for p in r.problems]
    reachable = [r for r in results if r.facts]
    engine = engine_for(plan.engine)
    if engine.one_version:
        versions = {r.node: r.facts.get("engine", "") for r in reachable if r.facts.get("engine")}
        if len(set(versions.values())) > 1:
            listed = ", ".join(f"{n} {v}" for n, v in sorted(versions.items()))
            problems.append(
                f"{engine.display_name} versions differ between nodes ({listed}): "
                "install one version everywhere"
            )
    if shared.writer is not None:
        writer = next(r for r in results if r.node == shared.writer)
        problems += shared.judge(writer, executors, all_reachable=len(reachable) == len(results))
    running = [name for r in results for name in r.running]
    if running:  # the one thing to say: its ports are in use by itself, the rest is moot
        problems = [
            f"deployment '{plan.deployment}' already runs on the nodes ({', '.join(running)}): "
            f"run `ucmctl down {plan.deployment}` first"
        ]
    notes, warnings = shared.filesystems(results)
    warnings += [w for r in results for w in r.warnings]
    facts = {
        r.node: {k: v for k, v in r.facts.items() if k in PROVENANCE_FACTS or k.startswith("image ")}
        for r in reachable
    }
    return Preflight(problems, shared.cleanup, notes, warnings, facts)


def node_problem(node: NodePlan, err: NodeError) -> str:
    """A node that could not be asked, as one preflight line (a refused host key says why)."""
    where = f"node {node.name} ({node.host})"
    what = "" if isinstance(err, HostKeyError) else "unreachable: "
    return f"{where}: {what}{err.reason}"


def _node_checks(plan: Plan, ex: Executor, shared: SharedCheck) -> NodeFacts:
    node = plan.nodes[ex.node.name]
    out = NodeFacts(node.name)
    where = f"node {node.name} ({node.host})"
    mooncake = _mooncake_tool(plan)
    script = _FACTS.format(
        python=shlex.quote(node.python),
        python_probe=_PYTHON_PROBE.format(engine=engine_for(plan.engine).version_probe).replace("'", "'\\''"),
        mooncake=shlex.quote(mooncake or "mooncake_master"),
        bind=shlex.quote(node.bind),
        listening=LISTENING,
    )
    script += _UNITS
    if node.name == shared.writer:
        script += shared.write_lines()
    if node.name in (shared.writer, *shared.readers):
        script += filesystems.probe_lines(shared.backends)
    bare_processes = [p for p in plan.on_node(node.name) if not p.detached]
    script += "\n" + lifecycle.running_lines(bare_processes) + "\n"
    try:
        done = ex.run(script, timeout=60)
    except NodeError as exc:
        out.problems.append(node_problem(node, exc))
        return out
    for line in done.stdout.splitlines():
        if line.startswith("running "):
            out.running.append(line.split(" ", 1)[1])
            continue
        key, _, value = line.partition("=")
        out.facts[key] = value.strip()
    f = out.facts
    processes = plan.on_node(node.name)
    contained = [p for p in processes if p.detached]
    if contained:
        problems, running = container_problems(where, ex, contained, f)
        out.problems += problems
        out.running += running
    bundled = [p for p in processes if p.container is not None and p.container.runtime == "oci"]
    if bundled:
        out.problems += bundle_problems(where, ex, bundled)
    bare = [p for p in processes if p.container is None]  # a pyxis step's image: enroot's to fetch
    out.problems += _bare_problems(plan, node, where, bare, f)
    out.problems += _bind_problems(where, node, f)
    _restart_mechanism(where, node, bare, f, out)
    listening = {int(p) for p in f.get("listening", "").split(",") if p.isdigit()}
    for p in processes:
        for label, port in p.ports.items():
            if port in listening:
                out.problems.append(f"{where}: port {port} ({p.name} {label}) is already in use")
    return out


def _restart_mechanism(
    where: str, node: NodePlan, bare: list[Process], f: dict[str, str], out: NodeFacts
) -> None:
    """systemd restarts a bare process only where it is the init and can run this user's units;
    where it could and ucmctl's supervisor does, one line says how to hand it over."""
    by = {p.restart.by for p in bare if p.restart is not None}
    units = f.get("units", "")
    if "systemd" in by and units != "ok":
        out.problems.append(
            f"{where}: systemd cannot restart its processes: {units or 'not asked'}; "
            f"fix that, or remove nodes.{node.name}.systemd"
        )
    elif "supervisor" in by and units == "ok":
        out.warnings.append(
            f"{where}: systemd is its init: set nodes.{node.name}.systemd: true to have "
            "systemd restart its processes (ucmctl's supervisor does now)"
        )


def _bare_problems(
    plan: Plan, node: NodePlan, where: str, processes: list[Process], f: dict[str, str]
) -> list[str]:
    """What the processes that run on the node's own Python need of it."""
    out = NodeFacts(node.name)
    servers = [p for p in processes if p.is_server]
    if not processes:
        return []
    if not f.get("python"):
        out.problems.append(
            f"{where}: Python '{node.python}' not found: set nodes.{node.name}.python or venv"
        )
        return out.problems
    if servers and not f.get("engine"):
        what = engine_for(plan.engine).display_name
        out.problems.append(f"{where}: {what} is not installed for {node.python}")
    needs_connector = engine_for(plan.engine).loads_ucm_connector and any(plan.uses_store(p) for p in servers)
    if needs_connector and f.get("connector") != "1":
        out.problems.append(
            f"{where}: the UCM connector (ucm_connector, ucm_store) is not importable by {node.python}: "
            "run `ucmctl install --wheel dist/ucmctl-*.whl TOPOLOGY`"
        )
    out.problems += _devices(where, node.platform, node.devices, servers, f)
    store = plan.store
    if store is not None and servers and "Cache" in store.tiers:
        need_kb = int(store.cache_buffer_capacity_gb * 2**20) * len(servers)
        for key, label in (("shm_kb", "/dev/shm"), ("mem_kb", "available RAM")):
            have = int(f.get(key) or 0)
            if have and have < need_kb:
                out.problems.append(
                    f"{where}: {label} has {have / 2**20:.1f} GiB free but {len(servers)} server(s) x "
                    f"cache_buffer_capacity_gb {store.cache_buffer_capacity_gb} need "
                    f"{need_kb / 2**20:.1f} GiB: lower storage.cache_buffer_capacity_gb"
                )
    if _mooncake_tool(plan) and any(p.role == "mooncake" for p in processes) and f.get("mooncake") != "1":
        out.problems.append(
            f"{where}: mooncake_master not found: pip install mooncake-transfer-engine "
            "(needs libibverbs1, librdmacm1, libnuma1)"
        )
    return out.problems


def _mooncake_tool(plan: Plan) -> str | None:
    for p in plan.processes:
        if p.role == "mooncake":
            return p.argv[0]
    return None


def _devices(where: str, platform: str, devices: int, servers: list[Process], f: dict[str, str]) -> list[str]:
    wanted = max((max(p.devices) + 1 for p in servers if p.devices), default=0)
    if wanted == 0:
        return []
    tool = DEVICE_COUNTER.get(Platform(platform))
    if tool is None:
        return []  # no standard way to count the cards (MUSA, CPU): trust the topology
    seen = int(f.get(_COUNTED_BY[tool]) or 0)
    if seen < wanted:
        return [f"{where}: {tool} sees {seen} {platform} devices but the plan uses {wanted}"]
    return []


def _bind_problems(where: str, node: NodePlan, f: dict[str, str]) -> list[str]:
    """The address the node's listeners bind must be one the others reach: a host name that the
    node resolves to itself through loopback (Debian's 127.0.1.1) would listen on loopback only."""
    name, bind, ip = node.name, node.bind, f.get("bind_ip", "")
    if node.transport == "local" or _ip(bind) is not None:
        return []  # written as an address: the server's bind error says it all if it is wrong
    if not ip:
        return [f"{where}: host '{bind}' does not resolve on the node: set nodes.{name}.bind to its IP"]
    resolved = _ip(ip)
    if resolved is not None and resolved.is_loopback:
        return [
            f"{where}: host '{bind}' resolves to {ip} on the node itself, so its servers would "
            f"listen on loopback only: set nodes.{name}.bind to the node's IP"
        ]
    addresses = f.get("addresses", "").split()
    if addresses and ip not in addresses:
        return [
            f"{where}: host '{bind}' resolves to {ip} on the node, which is not one of its "
            f"addresses ({', '.join(addresses)}): set nodes.{name}.bind"
        ]
    return []


def _ip(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(text)
    except ValueError:
        return None
