"""Slurm's own container support for real: `srun --container BUNDLE` with oci.conf and runc on the
test Slurm (Debian's slurm 22.05 and runc 1.1). A base OCI bundle stands in for a user's vLLM
image (Debian's python3 and the venv's packages, no ucmctl); `ucmctl image build` makes the bundle
the job steps run, `up` runs the simulator's 1P1D in it, and `down` leaves no process, no job and
no runc container."""

from __future__ import annotations

import json
import os
import re
import signal
from pathlib import Path

import pytest

from tests.integration.launch.test_slurm_deploy import external_hits, left
from tests.support.cli import Cli
from tests.support.containers import build_base_bundle
from tests.support.http import completion
from tests.support.processes import wait_for
from tests.support.slurm import Site, runc_containers
from tests.support.slurm_topology import centralized, queued
from tests.support.topology import write

pytestmark = [pytest.mark.slow, pytest.mark.root]
SHARES = "containers"  # podman, docker, their cgroups: one module at a time (tests/support/fixtures.py)


SLURM_SITE = {"oci": True}  # the site's `site` fixture (tests/support/fixtures.py)


@pytest.fixture(scope="module")
def base(site: Site) -> Path:
    """The user's bundle, on the folder both nodes share."""
    return build_base_bundle(site.hosts.shared / "bundles" / "base")


def in_bundle(site: Site, name: str, base: Path) -> str:
    """centralized(...) with every node's processes in the OCI bundle `base`."""
    text = centralized(site, name)
    container = f", container: {{runtime: oci, image: {base}}}}}"
    return re.sub(r"^(  h[12]: \{.*)\}$", lambda m: m.group(1) + container, text, flags=re.M)


def mount_namespace(pid: int) -> str:
    return os.readlink(f"/proc/{pid}/ns/mnt")


def test_image_build_then_up_runs_each_step_in_the_bundle(
    tmp_path: Path, site: Site, cli: Cli, base: Path
) -> None:
    topo = write(tmp_path, in_bundle(site, "s-oci", base))
    # Before `image build`: preflight refuses in one line, and submits nothing.
    early = cli("up", str(topo))
    assert early.returncode == 3, early.stderr
    errors = [line for line in early.stderr.splitlines() if line.startswith("error")]
    assert errors and all("is missing: run `ucmctl image build TOPOLOGY`" in e for e in errors), early.stderr
    assert queued(site) == [] and not (tmp_path / "home" / "deployments" / "s-oci.json").exists()

    build = cli("image", "build", str(topo), timeout=600)
    assert build.returncode == 0, build.stderr
    bundles = [p for p in base.parent.iterdir() if p.name.startswith("base.ucmctl-")]
    assert len(bundles) == 1, bundles  # both nodes' steps share one bundle (same mounts)
    bundle = bundles[0]
    record = json.loads((bundle / "ucmctl.json").read_text())
    assert record["base"] == str(base) and record["wheel"]
    # The rootfs is hard links of the base's; ucmctl is only in the derived bundle's own folder.
    python = "usr/bin/python3.11"
    assert (bundle / "rootfs" / python).stat().st_ino == (base / "rootfs" / python).stat().st_ino
    assert (bundle / "rootfs/opt/ucmctl/site-packages/ucm_connector").is_dir()
    assert not list((base / "rootfs").glob("**/ucm_connector"))
    config = json.loads((bundle / "config.json").read_text())
    mounted = {m["destination"] for m in config["mounts"]}
    assert str(site.hosts.shared / "s-oci") in mounted  # the store's backend
    assert {n["type"] for n in config["linux"]["namespaces"]}.isdisjoint({"network", "pid", "ipc"})
    again = cli("image", "build", str(topo))
    assert again.returncode == 0, again.stderr
    assert again.stdout.count(f"{bundle} already holds this ucmctl") == 2, again.stdout

    up = cli("up", str(topo))
    assert up.returncode == 0, up.stderr
    assert "deployment s-oci is up: 3 processes" in up.stdout
    processes = site.hosts.processes_of("s-oci")
    assert {h for h, _ in processes} == {"h1", "h2"}
    mine = mount_namespace(os.getpid())
    assert all(mount_namespace(pid) != mine for _, pid in processes)  # in the bundle's rootfs
    # each in a runc container of its step (node.user.job.step.task)
    assert len(runc_containers(site.slurm)) == 3, runc_containers(site.slurm)
    proxy = f"http://{site.hosts.host('h1').address}:8000"
    prompt = list(range(1, 161))
    assert completion(proxy, prompt)["usage"]["completion_tokens"] == 4
    for _ in range(3):
        completion(proxy, [*prompt, 7])
    assert external_hits(f"http://{site.hosts.host('h2').address}:8200") > 0  # through the store's mount
    status = cli("status", "s-oci")
    assert status.returncode == 0 and len(re.findall(r"\bhealthy\b", status.stdout)) == 3, status.stdout

    decode = next(pid for host, pid in processes if host == "h2")
    os.kill(decode, signal.SIGKILL)

    def decode_row() -> str:
        return next(row for row in cli("status", "s-oci").stdout.splitlines() if row.startswith("decode-0"))

    gone = r"\bh2\s+decode\s+http:8200\s+not running\b"
    assert wait_for(lambda: re.search(gone, decode_row())), decode_row()
    down = cli("down", "s-oci")
    assert down.returncode == 0, down.stderr
    assert left(site, "s-oci") == ([], [])
    assert wait_for(lambda: runc_containers(site.slurm) == []), runc_containers(site.slurm)
    assert site.slurm.job_processes() == []

    # The base bundle changed since: the derived one is stale, and `up` says so before submitting.
    config = json.loads((base / "config.json").read_text())
    config["process"]["env"].append("CHANGED=1")
    (base / "config.json").write_text(json.dumps(config, indent=1))
    stale = cli("up", str(topo))
    assert stale.returncode == 3, stale.stderr
    assert "as it was before: run `ucmctl image build TOPOLOGY`" in stale.stderr, stale.stderr
    assert queued(site) == []
