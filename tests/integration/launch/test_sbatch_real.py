"""`ucmctl render --slurm` through a real Slurm (slurmctld, one slurmd per network-namespace host,
munge), on the simulator: the script, submitted with plain `sbatch`, brings the deployment up by
itself; `ucmctl down TOPOLOGY` finds the job by its name and leaves nothing; a process that
fails its health check ends the job, which names it."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from tests.support.cli import Cli
from tests.support.http import completion
from tests.support.processes import wait_for
from tests.support.slurm import Site
from tests.support.slurm_topology import centralized, queued

pytestmark = [pytest.mark.slow, pytest.mark.root]

UP_TIMEOUT = 180.0


def ucmctl(site: Site, home: Path, *args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    return Cli(home, env=site.slurm.env)(*args, timeout=timeout)


def render_and_submit(site: Site, tmp: Path, text: str) -> tuple[Path, str, Path]:
    """(topology, job id, the job's output file): rendered with `ucmctl render --slurm`, submitted
    with plain `sbatch` from `tmp` (where the job's output goes)."""
    topo = tmp / "topology.yaml"
    topo.write_text(text)
    done = ucmctl(site, tmp / "home", "render", str(topo), "--slurm", str(tmp / "out"))
    assert done.returncode == 0, done.stderr
    script = Path(done.stdout.splitlines()[0])
    assert script.is_file() and "sbatch" in done.stdout.splitlines()[1]
    submitted = subprocess.run(["sbatch", str(script)], capture_output=True, text=True, env=site.slurm.env,
                               cwd=tmp, timeout=60)  # fmt: skip
    assert submitted.returncode == 0, submitted.stderr
    job = re.fullmatch(r"Submitted batch job (\d+)", submitted.stdout.strip())
    assert job, submitted.stdout
    name = re.search(r"^name: (\S+)$", text, re.MULTILINE)
    assert name
    return topo, job.group(1), tmp / f"ucmctl-{name.group(1)}-{job.group(1)}.out"


def text_of(path: Path) -> str:
    return path.read_text(errors="replace") if path.exists() else ""


def test_the_script_brings_the_deployment_up_and_down_finds_it(tmp_path: Path, site: Site) -> None:
    topo, job, output = render_and_submit(site, tmp_path, centralized(site, "b-1p1d"))
    proxy = f"http://{site.hosts.host('h1').address}:8000"
    try:
        up = wait_for(lambda: "is up" in text_of(output) or job not in queued(site), UP_TIMEOUT)
        said = text_of(output)
        assert up and f"ucmctl: deployment b-1p1d is up: 3 processes, proxy {proxy}" in said, said
        assert job in queued(site)
        # the job is named as the live launcher names it; each process a step on its node
        listed = site.slurm.run("squeue", "-h", "-j", job, "-o", "%j").stdout.strip()
        assert listed == "ucmctl-b-1p1d"
        steps = site.slurm.run("squeue", "-h", "-s", "-j", job, "-o", "%j %N").stdout.splitlines()
        placed = dict(
            line.split() for line in steps if line.strip() and not line.startswith(("batch", "extern"))
        )
        assert placed == {"prefill-0": "h1", "decode-0": "h2", "proxy": "h1"}, steps
        assert {h for h, _ in site.hosts.processes_of("b-1p1d")} == {"h1", "h2"}
        assert completion(proxy, list(range(1, 161)))["usage"]["completion_tokens"] == 4
    finally:
        down = ucmctl(site, tmp_path / "home", "down", str(topo))
    assert down.returncode == 0, down.stderr + down.stdout
    assert "3 processes stopped" in down.stdout, down.stdout
    assert wait_for(lambda: queued(site) == [], 30), queued(site)
    assert site.hosts.processes_of("b-1p1d") == []
    assert wait_for(lambda: site.slurm.job_processes() == [], 15), site.slurm.job_processes()


def test_a_process_that_fails_health_ends_the_job_which_names_it(tmp_path: Path, site: Site) -> None:
    # the simulator refuses a block size of 0: decode exits at once, its step ends
    text = centralized(site, "b-bad", decode_flags="{block-size: 0}")
    topo, job, output = render_and_submit(site, tmp_path, text)

    def final_state() -> str:
        """The job's state once Slurm is done with it ("" while it is still pending, running or
        completing: a job leaves `queued` while squeue may still say COMPLETING)."""
        state = site.slurm.run("squeue", "-h", "-j", job, "--states=all", "-o", "%T").stdout.strip()
        return "" if state in ("", "PENDING", "CONFIGURING", "RUNNING", "COMPLETING") else state

    try:
        still = f"job {job} still runs: {text_of(output)}"
        assert wait_for(lambda: job not in queued(site), UP_TIMEOUT), still
        said = text_of(output)
        assert "ucmctl: decode-0 on h2 failed: its job step ended before it became healthy" in said, said
        assert "last lines of" in said and "block-size" in said.split("last lines of", 1)[1], said
        assert "is up" not in said
        assert wait_for(final_state, 30) in ("CANCELLED", "FAILED"), final_state()  # not COMPLETED
    finally:
        if job in queued(site):
            site.slurm.run("scancel", job)
    assert wait_for(lambda: queued(site) == [], 30)
    assert site.hosts.processes_of("b-bad") == []
    assert wait_for(lambda: site.slurm.job_processes() == [], 15), site.slurm.job_processes()
    # nothing is left for `down` to do, and it says so
    down = ucmctl(site, tmp_path / "home", "down", str(topo))
    assert down.returncode == 0, down.stderr
    assert "0 processes stopped" in down.stdout
