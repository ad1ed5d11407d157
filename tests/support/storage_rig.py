"""A centralized 1P1D deployment of the simulator over SSH whose store is a real GlusterFS volume
served from a third test host, and the faults a network filesystem has: for the storage-fault
tests (tests/integration/deploy/test_storage_faults.py) and benchmarks/storage_outage.py."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from tests.support import gluster
from tests.support.cli import Cli
from tests.support.http import metrics
from tests.support.netns import Cluster, cluster_or_skip
from tests.support.processes import wait_for
from tests.support.topology import node_lines

NAME = "f-storage"
BOUND_S = 2.0  # load_timeout_s of the deployment, and its dump_timeout_s unless one is given


@dataclass
class Rig:
    hosts: Cluster
    vol: gluster.Volume
    cli: Cli
    tmp: Path

    def url(self, host: str, port: int) -> str:
        return f"http://{self.hosts.host(host).address}:{port}"

    def served(self) -> float:
        """Requests the prefill server finished (every request passes it once)."""
        return sum(float(line.rsplit(" ", 1)[1]) for line in metrics(self.url("h1", 8100)).splitlines()
                   if line.startswith("vllm:request_success_total"))  # fmt: skip

    def longest_store_waits(self) -> dict[str, float]:
        """The longest lookup, load and save on either server, with the server and op."""
        waits = {f"{host} {line.split('op=')[1].split('}')[0]}": float(line.rsplit(" ", 1)[1])
                 for port, host in ((8100, "h1"), (8200, "h2"))
                 for line in metrics(self.url(host, port)).splitlines()
                 if line.startswith("ucmctl_sim_store_wait_max_seconds")}  # fmt: skip
        if len(waits) != 6:
            raise RuntimeError(f"both servers should export their longest store waits: {waits}")
        return waits

    def bench(self, tag: str, prompts: int, rate: float, seed: int) -> list[str]:
        save = self.tmp / f"{tag}.json"
        return [sys.executable, "-m", "ucmctl", "bench", "-d", NAME, "--prefix-ratio", "0",
                "--input-len", "512", "--output-len", "16", "--num-prompts", str(prompts),
                "--request-rate", str(rate), "--seed", str(seed), "--save", str(save), "-q"]  # fmt: skip

    def run_bench(self, tag: str, prompts: int, rate: float, seed: int,
                  fault: Callable[[], None] | None = None) -> tuple[str, dict]:  # fmt: skip
        """One bench run; `fault` runs once 8 of its requests are done (its measure phase is
        under way) and returns when the storage is back; the run's stdout and saved result."""
        start = self.served()
        run = subprocess.Popen(self.bench(tag, prompts, rate, seed), stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, env=self.cli.env)  # fmt: skip
        try:
            if fault is not None:
                if not wait_for(lambda: self.served() >= start + 8 or run.poll() is not None, timeout=60):
                    raise RuntimeError("the run sent no requests")
                if run.poll() is not None:
                    raise RuntimeError("the run ended before the fault")
                fault()
            out, err = run.communicate(timeout=300)
        finally:
            if run.poll() is None:
                run.kill()
        if run.returncode or "Traceback" in err:
            raise RuntimeError(f"bench failed ({run.returncode}): {err[-3000:]}")
        return out, json.loads((self.tmp / f"{tag}.json").read_text())


@contextlib.contextmanager
def storage_rig(tmp: Path, dump_s: float = BOUND_S) -> Iterator[Rig]:
    """Three test hosts, the volume from h3 mounted on h1 and h2, the deployment up on them
    (its saves bounded at `dump_s`); down and gone afterwards. Callers check
    `gluster.available()` first."""
    with (
        cluster_or_skip(3) as hosts,
        gluster.gluster_volume(
            hosts, "faults", server="h3", clients=["h1", "h2"], brick_in_memory="1g"
        ) as vol,
    ):
        # A client gives up on a server that does not answer after this long (default 42 s).
        vol.gluster("volume", "set", vol.name, "network.ping-timeout", "5")
        vol.wait_writable(within=BOUND_S / 4)  # a new volume settles before it is measured
        cli = Cli(tmp / "home", hosts.ssh_config)
        topo = tmp / "topology.yaml"
        topo.write_text(f"""
name: {NAME}
mode: centralized
engine: sim
model: {{path: sim-model}}
nodes:
{node_lines(hosts, ["h1", "h2"])}
storage:
  storage_backends: {vol.mount / "kv"}
  cache_buffer_capacity_gb: 0.25
  load_timeout_s: {BOUND_S}
  dump_timeout_s: {dump_s}
prefill: {{nodes: [h1], port: 8100, flags: {{block-size: 16, kv-bytes-per-token: 2048}}}}
decode: {{nodes: [h2], port: 8200, flags: {{block-size: 16, kv-bytes-per-token: 2048}}}}
proxy: {{node: h1, port: 8000}}
""")
        up = cli("up", str(topo))
        if up.returncode:
            raise RuntimeError(f"up failed: {up.stderr[-3000:]}")
        try:
            yield Rig(hosts, vol, cli, tmp)
        finally:
            down = cli("down", NAME)
            if down.returncode:
                raise RuntimeError(f"down failed: {down.stderr[-3000:]}")
