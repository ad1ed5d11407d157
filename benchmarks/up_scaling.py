"""`ucmctl up` on 8 hosts against the same per-host work on 1 host (target: at most 1.5x).

    sudo python benchmarks/up_scaling.py [--hosts 8] [--repeats 3] [--load-seconds 0,5]
                                         [--host-cpus 0.2,shared]

Both runs happen here, on network-namespace hosts with real sshd (as the tests make them), each
host running one simulator server: preflight over SSH, staging, start, health gate, then `down`.
Serial orchestration would take about N times the one-host time; the ratio shows how close to
fully parallel `up` is.

On a cluster every host has CPUs of its own. Here all hosts live on this machine's few cores,
so the per-host work (sshd sessions, login shells, Python starts, the servers) of 8 hosts queues
for the same cores, which no orchestrator can avoid. `--host-cpus` sets how the hosts get CPU:
a number gives each host a CPU cgroup of that many cores (its sshd and everything started under
it), the same in the 1-host and the 8-host run, so 8 hosts are 8 equal machines, as on a
cluster (keep hosts x share below the cores here, leaving some for ucmctl itself); `shared`
lets all hosts take turns on every core. The CPU seconds of each run are printed too. The
servers are measured starting at once (`--load-seconds 0`: all per-host work is CPU) and taking
a few seconds to load like a real server loading weights (`sim serve --load-seconds`; a real
vLLM takes minutes).
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import sys
import time
from pathlib import Path

from rich.console import Console

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.support.netns import Cluster, available, cluster, cpu_limits_available
from ucmctl.deploy.api import deploy_down, deploy_up
from ucmctl.deploy.state import StateStore
from ucmctl.topology.load import parse_topology


def topology(c: Cluster, names: list[str], tag: str, load_seconds: float) -> str:
    line = "  {n}: {{host: {addr}, key: {key}, platform: cpu, python: {py}}}"
    nodes = "\n".join(line.format(n=n, addr=c.host(n).address, key=c.key, py=sys.executable) for n in names)
    return f"""
name: scale-{tag}
mode: mixed
engine: sim
model: {{path: sim-model}}
nodes:
{nodes}
storage: {{storage_backends: {c.shared / tag}, cache_buffer_capacity_gb: 0.1}}
mixed: {{nodes: [{", ".join(names)}], port: 8500, flags: {{load-seconds: {load_seconds}}}}}
"""


def cpu_seconds() -> float:
    fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    ticks = sum(int(x) for x in fields) - int(fields[3]) - int(fields[4])  # minus idle and iowait
    return ticks / os.sysconf("SC_CLK_TCK")


def own_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def timed_up(
    c: Cluster, names: list[str], tag: str, store: StateStore, load_seconds: float
) -> tuple[float, float, float]:
    """Wall seconds, machine CPU seconds and ucmctl's own CPU seconds of one `up`."""
    topo = parse_topology(topology(c, names, tag, load_seconds))
    quiet = Console(file=open(os.devnull, "w"))  # noqa: SIM115 - closed with the process
    cpu0, own0, t0 = cpu_seconds(), own_cpu(), time.perf_counter()
    deploy_up(topo, "<bench>", console=quiet, store=store)
    wall, cpu, own = time.perf_counter() - t0, cpu_seconds() - cpu0, own_cpu() - own0
    deploy_down(topo.name, console=quiet, store=store)
    return wall, cpu, own


def seconds_list(text: str) -> list[float]:
    try:
        values = [float(x) for x in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of seconds") from None
    if any(v < 0 or v > 3600 for v in values):
        raise argparse.ArgumentTypeError("load times must be between 0 and 3600 s")
    return values


def share_list(text: str) -> list[float | None]:
    """`0.2,shared` -> [0.2, None]."""
    shares: list[float | None] = []
    for item in text.split(","):
        if item == "shared":
            shares.append(None)
            continue
        try:
            share = float(item)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{item!r} is neither a number of cores nor 'shared'") from None
        if not 0.01 <= share <= (os.cpu_count() or 1):
            raise argparse.ArgumentTypeError(f"{item}: a host's share must be 0.01 to {os.cpu_count()} cores")
        shares.append(share)
    return shares


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--hosts", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--load-seconds", default="0,5", type=seconds_list,
                    help="comma-separated server load times to measure")  # fmt: skip
    ap.add_argument("--host-cpus", default="0.2,shared", type=share_list,
                    help="comma-separated: cores per host (a CPU cgroup each), or 'shared'")  # fmt: skip
    args = ap.parse_args()
    reason = available() or (cpu_limits_available() if any(args.host_cpus) else None)
    if reason:
        sys.exit(f"up_scaling: {reason}")
    runs: dict[tuple[float | None, float], tuple[list, list]] = {}
    for share in args.host_cpus:
        with cluster(args.hosts, cpus_per_host=share) as c:
            os.environ["UCMCTL_SSH_CONFIG"] = str(c.ssh_config)
            store = StateStore(c.base / "state")
            names = [h.name for h in c.hosts]
            for load in args.load_seconds:
                one, many = runs.setdefault((share, load), ([], []))
                for i in range(args.repeats):  # interleaved, so drifts in machine load hit both alike
                    tag = f"{i}-{int(load * 10)}"
                    one.append(timed_up(c, names[:1], f"one{tag}", store, load))
                    many.append(timed_up(c, names, f"many{tag}", store, load))
    for (share, load), (one, many) in runs.items():
        report(share, load, one, many, args.hosts, args.repeats)


def report(share: float | None, load: float, one: list, many: list, hosts: int, repeats: int) -> None:
    t1 = statistics.median(w for w, _, _ in one)
    tn = statistics.median(w for w, _, _ in many)
    cpu_n = statistics.median(cpu for _, cpu, _ in many)
    own_1 = statistics.median(own for _, _, own in one)
    own_n = statistics.median(own for _, _, own in many)
    cores = os.cpu_count() or 1
    cpus = "all hosts share this machine's cores" if share is None else f"{share:g} cores per host"
    print(f"{cpus}, servers loading {load:g} s:")
    print(f"  up + health on 1 host:  {t1:.2f} s (median of {repeats})")
    print(f"  up + health on {hosts} hosts: {tn:.2f} s -> ratio {tn / t1:.2f}x (target <= 1.5x; "
          f"serial would be ~{hosts}x)")  # fmt: skip
    print(f"  CPU used by the {hosts}-host run: {cpu_n:.2f} CPU-s over {tn:.2f} s wall on {cores} cores "
          f"({cpu_n / (tn * cores):.0%} of the machine); ucmctl itself used {own_1:.2f} CPU-s for 1 host "
          f"and {own_n:.2f} for {hosts}: the rest is the hosts' own work (sshd, Python starts, "
          "the servers)")  # fmt: skip


if __name__ == "__main__":
    main()
