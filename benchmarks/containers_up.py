"""`ucmctl up` of a 1P1D with every process in a podman container against the same topology bare,
and the derived image's build (targets, issue #24: containerized time to healthy at most 1.2x
bare's, side by side in one run; the derived build under 30 s on top of the base image, 0 s when
the wheel has not changed).

    sudo python benchmarks/containers_up.py [--rounds 3] [--warmup 1] [--json PATH]

Two network-namespace hosts with real sshd and a podman each (tests/support/netns.py with
containers), the real vLLM on the CPU (the tiny model), the UCM store on the hosts' shared folder:
prefill on h1, decode on h2, the proxy on h1. The container image stands in for a user's vLLM
image (Debian's Python and the venv's vLLM, without ucmctl: tests/support/containers.py); `ucmctl
image build` derives the image ucmctl runs on both hosts, timed (the build), then again (the reuse).

Rounds alternate bare, containers, bare, ... (after --warmup unmeasured rounds of each). A round
times `python -m ucmctl up TOPO` as typed, KV probe included (wall clock until it exits 0; "until
the probe" is when `up` printed `KV probe: one request ...`), then `ucmctl down`, then checks that
no process and no container of the deployment is left.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.slurm_vs_ssh_up import breakdown, stages, timed
from tests.support import netns
from tests.support.containers import build_base_image, cgroup_parent, remove_cgroup

TARGET_UP = 1.2
TARGET_BUILD_S = 30.0
BASE = "ucmctl-bench-vllm:1"
NAMES = {"bare": "bench-bare", "pod": "bench-pod"}


def topology(c: netns.Cluster, model: Path, kind: str, cgroup: str) -> str:
    container = (
        f", container: {{runtime: podman, image: localhost/{BASE}, options: [--cgroup-parent={cgroup}]}}"
        if kind == "pod"
        else ""
    )
    env = 'VLLM_CPU_KVCACHE_SPACE: "1", HF_HUB_OFFLINE: "1", TORCHDYNAMO_DISABLE: "1"'
    flags = "{max-model-len: 2048, block-size: 128, max-num-seqs: 4, enforce-eager: true}"
    nodes = "\n".join(
        f"  {n}: {{host: {c.host(n).address}, key: {c.key}, platform: cpu, devices: 0, "
        f"python: {sys.executable}{container}}}"
        for n in ("h1", "h2")
    )
    name = NAMES[kind]
    return f"""
name: {name}
mode: centralized
model: {{path: {model}, served_name: m, dtype: bfloat16, hash_seed: 0}}
nodes:
{nodes}
storage: {{storage_backends: {c.shared / name}, cache_buffer_capacity_gb: 0.25}}
prefill: {{nodes: [h1], port: 8100, env: {{{env}, VLLM_CPU_OMP_THREADS_BIND: "0"}}, flags: {flags}}}
decode: {{nodes: [h2], port: 8200, env: {{{env}, VLLM_CPU_OMP_THREADS_BIND: "1"}}, flags: {flags}}}
proxy: {{node: h1, port: 8000}}
"""


def left_over(c: netns.Cluster, kind: str) -> list[str]:
    """Processes and containers of the deployment still on the hosts."""
    found = [f"process {p}" for p in c.processes_of(NAMES[kind])]
    for h in ("h1", "h2"):
        out = subprocess.run(
            [
                "ssh",
                "-F",
                str(c.ssh_config),
                h,
                "podman",
                "ps",
                "-aq",
                "--filter",
                f"label=io.ucmctl.deployment={NAMES[kind]}",
            ],
            capture_output=True,
            text=True,
            timeout=60,
        ).stdout.split()
        found += [f"container {i} on {h}" for i in out]
    return found


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    from ucmctl.tinymodel import make_model

    group = f"ucmctl-bench-{os.getpid()}"
    results: dict = {"rounds": [], "builds": []}
    with netns.cluster(2, containers=True) as c:
        home = c.base / "bench-home"
        env = {**os.environ, "UCMCTL_HOME": str(home), "UCMCTL_SSH_CONFIG": str(c.ssh_config)}
        model = make_model(c.shared / "tiny", size="tiny", seed=0)
        print("building the base image (not timed: it stands in for a pulled one) ...", flush=True)
        build_base_image(c.image_env, BASE, engine=True)
        topo = {}
        for kind in NAMES:
            topo[kind] = c.base / f"{kind}.yaml"
            topo[kind].write_text(topology(c, model, kind, cgroup_parent(group)))

        def ucmctl(*a: str) -> tuple[float, int, list[tuple[float, str]], str]:
            return timed([sys.executable, "-m", "ucmctl", *a], env, 900)

        for label in ("build", "reuse"):
            wall, rc, lines, out = ucmctl("image", "build", str(topo["pod"]))
            if rc:
                raise SystemExit(f"image build failed: {[x for _, x in lines][-10:]}")
            per_host = {
                m[1]: float(m[2]) if m[2] else 0.0
                for m in re.finditer(r"^(h\d): \S+ (?:built in ([0-9.]+) s|already holds)", out, re.M)
            }
            results["builds"].append({"what": label, "wall_s": wall, "per_host_s": per_host})
            print(f"image {label}: {wall:.1f} s in all, per host {per_host}", flush=True)

        try:
            order = [k for _ in range(args.warmup + args.rounds) for k in ("bare", "pod")]
            for i, kind in enumerate(order):
                up_s, rc, lines, out = ucmctl("up", str(topo[kind]))
                if rc:
                    raise SystemExit(f"up ({kind}) exited {rc}: {[x for _, x in lines][-20:]}")
                marks = stages(lines, up_s)
                down_s, drc, _, _ = ucmctl("down", NAMES[kind])
                left = left_over(c, kind)
                if drc or left:
                    raise SystemExit(f"down ({kind}) exited {drc}, left: {left}")
                measured = i >= 2 * args.warmup
                results["rounds"].append(
                    {
                        "kind": kind,
                        "up_s": up_s,
                        "until_probe_s": marks.get("probe", up_s),
                        "down_s": down_s,
                        "measured": measured,
                        "stages": breakdown(marks),
                        "stderr": [[round(t, 3), x] for t, x in lines],
                    }
                )
                print(
                    f"{'round' if measured else 'warm-up'} {kind}: up {up_s:.2f} s "
                    f"(until the probe {marks.get('probe', up_s):.2f} s), down {down_s:.2f} s",
                    flush=True,
                )
        finally:
            remove_cgroup(group)
    med = {
        k: statistics.median(r["up_s"] for r in results["rounds"] if r["kind"] == k and r["measured"])
        for k in NAMES
    }
    probe = {
        k: statistics.median(
            r["until_probe_s"] for r in results["rounds"] if r["kind"] == k and r["measured"]
        )
        for k in NAMES
    }
    ratio = med["pod"] / med["bare"]
    build = max(results["builds"][0]["per_host_s"].values())
    reuse = results["builds"][1]["wall_s"]  # nothing built: `image build` as a whole, SSH included
    print(
        f"\nup median: bare {med['bare']:.2f} s, containers {med['pod']:.2f} s: {ratio:.2f}x "
        f"(target <= {TARGET_UP}x: {'met' if ratio <= TARGET_UP else 'NOT met'}); until the probe "
        f"{probe['pod'] / probe['bare']:.2f}x"
    )
    print(
        f"derived build {build:.1f} s on top of the base image (target < {TARGET_BUILD_S:.0f} s: "
        f"{'met' if build < TARGET_BUILD_S else 'NOT met'}); unchanged wheel: nothing built, "
        f"`ucmctl image build` {reuse:.1f} s in all"
    )
    print("\nmedian seconds per stage of `up`:")
    labels = [k for r in results["rounds"][:1] for k in r["stages"]]
    for label in labels:
        per = {
            k: statistics.median(
                r["stages"].get(label, 0.0) for r in results["rounds"] if r["kind"] == k and r["measured"]
            )
            for k in NAMES
        }
        print(f"  {label:28s} bare {per['bare']:6.2f}  containers {per['pod']:6.2f}")
    results.update(up_median_s=med, until_probe_median_s=probe, ratio=ratio, build_s=build, reuse_s=reuse)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    return 0 if ratio <= TARGET_UP and build < TARGET_BUILD_S else 1


if __name__ == "__main__":
    sys.exit(main())
