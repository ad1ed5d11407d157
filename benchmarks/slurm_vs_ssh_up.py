"""`ucmctl up` through Slurm against the SSH launcher on the same hosts (target: Slurm's time to
healthy at most 1.5x SSH's, median of 3; issue #18).

    sudo python benchmarks/slurm_vs_ssh_up.py [--rounds 3] [--warmup 1] [--json PATH] [--no-profile]

Two network-namespace hosts with real sshd (h1, h2) and one real Slurm on them (slurmctld here,
one slurmd per host), both made here and torn down at the end, Ctrl-C or failure included. The
same 2P2D centralized simulator deployment (2 prefill servers on h1, 2 decode servers on h2, the
proxy on h1, storage on the hosts' shared folder) is written twice: as an SSH topology (nodes
with host, key and python; UCMCTL_SSH_CONFIG is the hosts' SSH config) and as a Slurm topology
(the same nodes, `cluster: {kind: slurm, partition: debug}`, `workdir` on the shared folder).

Rounds alternate SSH, Slurm, SSH, Slurm, ... (after --warmup unmeasured rounds of each). A
round times `python -m ucmctl up TOPO` as a user types it, KV probe included (wall clock of the
subprocess until it exits 0), then `python -m ucmctl down NAME`, then checks that nothing is
left (no process carrying the deployment's marker on the hosts, `squeue -h -o %i` empty) and
aborts if something is. `up`'s stderr is read line by line as it comes, each line stamped on
arrival, which splits `up` into stages at no cost: "no probe" is the moment `up` prints
"KV probe: one request ...", i.e. time to healthy without the probe.

The profile (default on; --no-profile skips it) is one more Slurm `up`/`down`, not counted in
the table, with `srun` wrapped by a shell that logs each call's start, end and step name: how
many steps `up` runs, and what they cost.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.support import netns, slurm

TARGET = 1.5
NAMES = {"ssh": "bench-ssh", "slurm": "bench-slurm"}
DEPLOYMENT_TIMEOUT = 300.0


def topology(hosts: netns.Cluster, kind: str) -> str:
    name = NAMES[kind]
    workdir = f", workdir: {hosts.shared / 'work'}" if kind == "slurm" else ""
    nodes = "\n".join(f"  {n}: {{host: {hosts.host(n).address}, key: {hosts.key}, platform: cpu, "
                      f"python: {sys.executable}{workdir}}}" for n in ("h1", "h2"))  # fmt: skip
    cluster = "cluster: {kind: slurm, partition: debug}\n" if kind == "slurm" else ""
    return f"""
name: {name}
mode: centralized
engine: sim
model: {{path: sim-model}}
{cluster}nodes:
{nodes}
storage: {{storage_backends: {hosts.shared / name}, cache_buffer_capacity_gb: 0.25}}
prefill: {{nodes: [h1], servers_per_node: 2, port: 8100, flags: {{block-size: 16}}}}
decode: {{nodes: [h2], servers_per_node: 2, port: 8200, flags: {{block-size: 16}}}}
proxy: {{node: h1, port: 8000}}
"""


class Aborted(Exception):
    pass


Lines = list[tuple[float, str]]


def timed(argv: list[str], env: dict[str, str], timeout: float) -> tuple[float, int, Lines, str]:
    """Wall seconds, exit status, stderr lines stamped (seconds since start) as they arrived,
    and stdout, of one command."""
    lines: Lines = []
    out: list[str] = []
    t0 = time.perf_counter()
    proc = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)  # fmt: skip

    def read_err() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            lines.append((time.perf_counter() - t0, line.rstrip("\n")))

    def read_out() -> None:
        assert proc.stdout is not None
        out.append(proc.stdout.read())

    readers = [threading.Thread(target=f, daemon=True) for f in (read_err, read_out)]
    for r in readers:
        r.start()
    try:
        proc.wait(timeout=timeout)
    except BaseException:  # Ctrl-C or a hang: the command goes too (its group: not its Slurm steps)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        raise
    wall = time.perf_counter() - t0
    for r in readers:
        r.join(timeout=5)
    return wall, proc.returncode, lines, "".join(out)


def stages(lines: Lines, wall: float) -> dict[str, float]:
    """Moments of `up` (seconds since the command started), from its stderr lines."""
    marks: dict[str, float] = {}

    def first(key: str, t: float) -> None:
        marks.setdefault(key, t)

    for t, line in lines:
        if line.startswith("Slurm: submitting"):
            first("submit", t)
        elif line.startswith("Slurm: job") and " runs on " in line:
            first("running", t)
        elif line.startswith("preflight on"):
            first("preflight", t)
        elif line.startswith("proxy (") and line.endswith(": starting"):
            first("proxy", t)
        elif line.endswith(": starting"):
            first("starting", t)
        elif line.endswith(": healthy"):
            marks["healthy"] = t  # the last one
        elif line.startswith("KV probe: one request"):
            first("probe", t)
    marks["exit"] = wall
    return marks


def breakdown(marks: dict[str, float]) -> dict[str, float]:
    """Seconds per stage of one `up`, from `stages`' moments: each stage ends at its mark."""
    first = "start, launcher checks" if "submit" in marks else "start, node locks"
    order = [(first, "submit"), ("allocation", "running"), ("node locks", "preflight"),
             ("preflight, staging", "starting"), ("servers start to healthy", "proxy"),
             ("proxy start to healthy", "probe"), ("KV probe, exit", "exit")]  # fmt: skip
    if "submit" not in marks:
        order = [(first, "preflight"), *order[3:]]
    out: dict[str, float] = {}
    last = 0.0
    for label, key in order:
        if key in marks:
            out[label] = marks[key] - last
            last = marks[key]
    return out


class Bench:
    def __init__(self, hosts: netns.Cluster, site: slurm.Slurm, home: Path) -> None:
        self.hosts, self.site = hosts, site
        self.env = {**site.env, "UCMCTL_HOME": str(home), "UCMCTL_SSH_CONFIG": str(hosts.ssh_config)}
        self.topo = {}
        for kind in NAMES:
            path = home.parent / f"{kind}.yaml"
            path.write_text(topology(hosts, kind))
            self.topo[kind] = path

    def ucmctl(self, *args: str, env: dict[str, str] | None = None) -> tuple[float, int, Lines, str]:
        return timed([sys.executable, "-m", "ucmctl", *args], env or self.env, DEPLOYMENT_TIMEOUT)

    def queued(self) -> list[str]:
        return self.site.run("squeue", "-h", "-o", "%i").stdout.split()

    def check_clean(self, kind: str) -> float:
        """Seconds it took until nothing of the deployment is left (0 at once); abort after 5 s."""
        t0 = time.monotonic()
        while True:
            procs, jobs = self.hosts.processes_of(NAMES[kind]), self.queued()
            if not procs and not jobs:
                return time.monotonic() - t0
            if time.monotonic() - t0 > 5:
                raise Aborted(f"after `ucmctl down {NAMES[kind]}` something is left: processes {procs}, "
                              f"Slurm jobs {jobs}")  # fmt: skip
            time.sleep(0.1)

    def round(
        self, kind: str, env: dict[str, str] | None = None, between: Callable[[], None] | None = None
    ) -> dict:
        up_s, rc, lines, out = self.ucmctl("up", str(self.topo[kind]), env=env)
        if rc != 0:
            text = "\n".join(line for _, line in lines[-30:])
            raise Aborted(f"`ucmctl up` ({kind}) exited {rc}:\n{text}\n{out}")
        if between is not None:
            between()
        down_s, drc, dlines, dout = self.ucmctl("down", NAMES[kind], env=env)
        if drc != 0:
            raise Aborted(f"`ucmctl down {NAMES[kind]}` exited {drc}:\n"
                          + "\n".join(line for _, line in dlines[-30:]) + dout)  # fmt: skip
        left_s = self.check_clean(kind)
        marks = stages(lines, up_s)
        return {"launcher": kind, "up_s": up_s, "down_s": down_s, "clean_after_s": left_s,
                "up_no_probe_s": marks.get("probe", up_s), "marks": marks,
                "stderr": [[round(t, 4), line] for t, line in lines]}  # fmt: skip

    def cleanup(self) -> None:
        """Best effort after a failure or Ctrl-C: `down` both deployments."""
        for kind in NAMES:
            with contextlib.suppress(Exception):
                subprocess.run([sys.executable, "-m", "ucmctl", "down", NAMES[kind], "--grace", "2"],
                               env=self.env, capture_output=True, timeout=120)  # fmt: skip


SHIM = """#!/bin/bash
s=$(date +%s.%N)
name=unnamed
for a in "$@"; do case "$a" in --job-name=*) name=${{a#--job-name=}};; esac; done
last="${{@: -1}}"
cmd=$(printf '%s' "$last" | tr '\\n\\t' '  ' | cut -c1-120)
printf 'start\\t%s\\t%s\\t%s\\t%s\\n' "$$" "$s" "$name" "$cmd" >> {log}
{real} "$@"
rc=$?
printf 'end\\t%s\\t%s\\t%s\\n' "$$" "$(date +%s.%N)" "$rc" >> {log}
exit $rc
"""


def step_costs(bench: Bench, n: int = 10) -> dict:
    """Seconds of one bare command on h1, one after another: a job step of the running
    allocation (`srun --overlap`, as ucmctl runs each command) against an SSH session."""
    job = bench.queued()[0]
    srun = ["srun", f"--jobid={job}", "--overlap", "--nodelist=h1", "--nodes=1", "--ntasks=1", "--quiet",
            "/bin/sh", "-c", "true"]  # fmt: skip
    ssh = ["ssh", "-F", str(bench.hosts.ssh_config), "h1", "true"]
    out: dict[str, list[float]] = {"srun": [], "ssh": []}
    for _ in range(n):
        for label, argv in (("srun", srun), ("ssh", ssh)):
            t0 = time.perf_counter()
            subprocess.run(argv, env=bench.env, capture_output=True, check=True, timeout=30, cwd="/tmp")
            out[label].append(time.perf_counter() - t0)
    return out


def profile(bench: Bench, home: Path) -> dict:
    """One Slurm up/down with every srun call logged, and the cost of one bare step."""
    shim_dir, log = home.parent / "srun-shim", home.parent / "srun.log"
    shim_dir.mkdir(exist_ok=True)
    real = subprocess.run(["bash", "-c", "command -v srun"], capture_output=True, text=True).stdout.strip()
    (shim_dir / "srun").write_text(SHIM.format(real=real, log=log))
    (shim_dir / "srun").chmod(0o755)
    log.write_text("")
    env = {**bench.env, "PATH": f"{shim_dir}:{bench.env['PATH']}"}
    costs: dict[str, list[float]] = {}
    t_wall0 = time.time()
    result = bench.round("slurm", env=env, between=lambda: costs.update(step_costs(bench)))
    up_end = result["up_s"]
    calls: dict[str, dict] = {}
    for line in log.read_text().splitlines():
        f = line.split("\t")
        if f[0] == "start":
            calls[f[1]] = {"start": float(f[2]) - t_wall0, "end": None, "rc": None, "name": f[3],
                           "command": f[4] if len(f) > 4 else ""}  # fmt: skip
        elif f[0] == "end" and f[1] in calls:
            calls[f[1]].update(end=float(f[2]) - t_wall0, rc=int(f[3]))
    during_up = [c for c in calls.values() if c["start"] < up_end]
    # short steps: ended before `up` did (commands); the rest: processes, node locks, watches
    short = [c for c in during_up if c["end"] is not None and c["end"] <= up_end]
    return {"round": result, "calls": list(calls.values()), "during_up": len(during_up),
            "short_during_up": short, "step_costs": costs}  # fmt: skip


def summarize(rows: list[dict], key: str) -> tuple[float, float, float]:
    values = [r[key] for r in rows]
    return statistics.median(values), min(values), max(values)


def report(results: list[dict], prof: dict | None) -> dict:
    by = {kind: [r for r in results if r["launcher"] == kind] for kind in NAMES}
    print()
    print(f"{'launcher':<8} {'up median':>10} {'min':>7} {'max':>7}   {'up w/o probe':>12}   "
          f"{'down median':>11} {'min':>7} {'max':>7}")  # fmt: skip
    med = {}
    for kind, rows in by.items():
        up, np_, down = summarize(rows, "up_s"), summarize(rows, "up_no_probe_s"), summarize(rows, "down_s")
        med[kind] = {"up": up[0], "up_no_probe": np_[0], "down": down[0]}
        print(f"{kind:<8} {up[0]:>9.2f}s {up[1]:>6.2f}s {up[2]:>6.2f}s   {np_[0]:>11.2f}s   "
              f"{down[0]:>10.2f}s {down[1]:>6.2f}s {down[2]:>6.2f}s")  # fmt: skip
    ratio = med["slurm"]["up"] / med["ssh"]["up"]
    ratio_np = med["slurm"]["up_no_probe"] / med["ssh"]["up_no_probe"]
    ratio_down = med["slurm"]["down"] / med["ssh"]["down"]
    verdict = "PASS" if ratio <= TARGET else "FAIL"
    print(f"\nSlurm/SSH, median `up` (KV probe included): {ratio:.2f}x (target <= {TARGET}x): {verdict}")
    print(
        f"Slurm/SSH, median `up` until the KV probe starts: {ratio_np:.2f}x; median `down`: {ratio_down:.2f}x"
    )
    print("\nwhere `up` goes (median seconds per stage, from its stderr lines as they arrived):")
    for kind, rows in by.items():
        parts = [breakdown(r["marks"]) for r in rows]
        labels = list(dict.fromkeys(k for p in parts for k in p))
        cells = ", ".join(f"{k} {statistics.median(p.get(k, 0.0) for p in parts):.2f}" for k in labels)
        print(f"  {kind}: {cells}")
    if prof is not None:
        short = prof["short_during_up"]
        print(f"\nprofile (one more Slurm round, srun wrapped; up {prof['round']['up_s']:.2f} s, "
              f"not in the table): {prof['during_up']} srun calls during `up`, {len(short)} of them "
              "short steps (ended before `up` did)")  # fmt: skip
        if short:
            durations = sorted(c["end"] - c["start"] for c in short)
            print(
                f"  short steps: median {statistics.median(durations) * 1000:.0f} ms, "
                f"min {durations[0] * 1000:.0f} ms, max {durations[-1] * 1000:.0f} ms, "
                f"sum {sum(durations):.2f} s (they overlap: nodes and processes run in parallel)"
            )
            groups: dict[str, list[float]] = {}
            for c in short:
                groups.setdefault(_kind_of(c["command"]), []).append(c["end"] - c["start"])
            for label, ds in sorted(groups.items(), key=lambda kv: -sum(kv[1])):
                print(f"    {label:<30} {len(ds):>3} calls, median {statistics.median(ds) * 1000:>5.0f} ms, "
                      f"sum {sum(ds):.2f} s")  # fmt: skip
        long = [c for c in prof["calls"] if c not in short and c["start"] < prof["round"]["up_s"]]
        names = ", ".join(sorted({c["name"] for c in long}))
        print(
            f"  long steps (processes, node locks, watches; end with `up` or `down`): {len(long)} ({names})"
        )
        costs = prof["step_costs"]
        if costs:
            sr, sh = statistics.median(costs["srun"]), statistics.median(costs["ssh"])
            print(f"  one bare command on h1, median of {len(costs['srun'])}: `srun --overlap true` "
                  f"{sr * 1000:.0f} ms, `ssh h1 true` {sh * 1000:.0f} ms")  # fmt: skip
    return {"median": med, "ratio_up": ratio, "ratio_up_no_probe": ratio_np, "ratio_down": ratio_down,
            "verdict": verdict}  # fmt: skip


def _kind_of(command: str) -> str:
    """A short label for a step's shell command (what ucmctl asked of the node)."""
    labels = (("cat ", "pidfile poll (start)"), ("PY=", "preflight (python check)"),
              ("echo \"seen0=", "preflight (shared storage)"), ("rm -f", "staging"),
              ("running=$(", "staging (running check)"), ("members()", "alive/stop"))  # fmt: skip
    for prefix, label in labels:
        if command.strip().startswith(prefix):
            return label
    return command.strip()[:30] or "(empty)"


@contextlib.contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    def handler(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    old = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=3, help="measured rounds per launcher")
    ap.add_argument("--warmup", type=int, default=1, help="unmeasured rounds per launcher first")
    ap.add_argument("--json", type=Path, help="save the raw numbers here")
    ap.add_argument("--no-profile", action="store_true", help="skip the traced Slurm round")
    args = ap.parse_args()
    for why in (netns.available(), slurm.available()):
        if why:
            print(f"cannot run here: {why}", file=sys.stderr)
            return 2
    load0 = os.getloadavg()
    print("load average at start: {:.2f} {:.2f} {:.2f}".format(*load0), flush=True)
    results: list[dict] = []
    prof = None
    with sigterm_as_interrupt(), netns.cluster(2) as hosts, slurm.slurm_cluster(hosts) as site:
        home = hosts.base / "bench" / "home"
        home.mkdir(parents=True)
        bench = Bench(hosts, site, home)
        try:
            for i in range(args.warmup):
                for kind in NAMES:
                    r = bench.round(kind)
                    print(
                        f"warm-up {i + 1} {kind:<5}: up {r['up_s']:.2f} s, down {r['down_s']:.2f} s",
                        flush=True,
                    )
            for i in range(args.rounds):
                for kind in NAMES:
                    r = bench.round(kind)
                    r["round"] = i + 1
                    results.append(r)
                    print(f"round {i + 1} {kind:<5}: up {r['up_s']:.2f} s (until the KV probe "
                          f"{r['up_no_probe_s']:.2f} s), down {r['down_s']:.2f} s, load "
                          f"{os.getloadavg()[0]:.2f}", flush=True)  # fmt: skip
            if not args.no_profile:
                prof = profile(bench, home)
        except BaseException as exc:
            if isinstance(exc, Aborted):
                print(f"aborted: {exc}", file=sys.stderr)
            bench.cleanup()
            if isinstance(exc, Aborted):
                return 1
            raise
    summary = report(results, prof)
    load1 = os.getloadavg()
    print("load average at end: {:.2f} {:.2f} {:.2f}".format(*load1))
    if args.json:
        doc = {"when": time.strftime("%Y-%m-%d %H:%M:%S"), "argv": sys.argv, "rounds": args.rounds,
               "warmup": args.warmup, "load_start": load0, "load_end": load1, "summary": summary,
               "results": results, "profile": prof}  # fmt: skip
        args.json.write_text(json.dumps(doc, indent=1))
        print(f"raw numbers: {args.json}")
    return 0 if summary["verdict"] == "PASS" else 1


if __name__ == "__main__":
    sys.exit(main())
