"""The shared storage fails during `ucmctl bench`, for real: a 1P1D centralized deployment of the
simulator over SSH whose store is a GlusterFS volume served from a third host, and in the middle
of the measured phase (a) the brick process is killed, (b) the storage host's link is cut for
30 s, (c) the volume is stopped and started again.

Each time: no request fails, no wrong byte is delivered (the simulator checks every loaded
block's bytes, a wrong one would count as `corrupt`), the report names the storage errors of
that phase by kind, no single store wait outlasts its bound (2 s for a lookup or a load, 5 s
for a save here) by more than a second, and once the storage is back a new run hits the store
as before.

The brick is a tmpfs: the faults are the network filesystem's; this machine's disk, busy with
other work, once slowed a healthy volume's file creations past the 2 s bound. The healthy runs
send 2 requests a second: a request's 32 new blocks are 32 files (and most of them a new
directory) on the volume; at 8 a second a quiet machine saw saves of 1.6 s, and past 2 s in
one run of two (at 2 a second: 0.8 s at most).
"""

from __future__ import annotations

import os
import re
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import gluster
from tests.support.storage_rig import BOUND_S, NAME, Rig, storage_rig

DUMP_S = 5.0  # the deployment's save bound (half the default): a save is a request's blocks
HEALTHY_RATE = 2.0  # requests a second, in the runs that must find no storage error

pytestmark = [pytest.mark.slow, pytest.mark.root]
SHARES = "gluster"  # glusterd: one module at a time (tests/support/fixtures.py)
QUIET = True  # while no real engine runs on this machine (tests/support/fixtures.py)


@pytest.fixture(scope="module")
def rig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Rig]:
    if reason := gluster.available():
        pytest.skip(reason)
    with storage_rig(Path(tmp_path_factory.mktemp("faults")), dump_s=DUMP_S) as r:
        yield r


def measured(doc: dict) -> dict:
    (cell,) = doc["cells"]
    return cell["measure"]


def decode_hit_rate(phase: dict) -> float:
    return phase["hit_rate"]["by_role"]["decode"]["external_hit_rate"]


def check_the_fault_run(rig: Rig, out: str, doc: dict, prompts: int, kinds: set[str]) -> dict:
    phase = measured(doc)
    assert phase["completed"] == prompts and phase["failed"] == 0, phase["errors"]
    total = phase["hit_rate"]["total"]
    assert total["ucm_load_errors_corrupt"] == 0  # no block delivered with wrong bytes
    errors = total["ucm_lookup_errors"] + total["ucm_load_errors"] + total["ucm_save_errors"]
    assert errors > 0, total
    seen = {k.rsplit("_", 1)[1] for k, v in total.items() if v and re.fullmatch(r"ucm_\w+_errors_\w+", k)}
    assert seen & kinds, (seen, total)
    said = [line for line in out.splitlines() if "UCM store:" in line]
    assert len(said) == 1 and said[0].startswith("measure"), out
    assert decode_hit_rate(phase) < 0.9  # the outage cost hits (recomputed), not requests
    assert phase["lost"] == []  # the bench's watch: every server stayed up and answered its health
    waits = rig.longest_store_waits()
    over = {op: s for op, s in waits.items() if s > (DUMP_S if op.endswith('"save"') else BOUND_S) + 1.0}
    assert not over, waits
    return phase


def check_recovered(rig: Rig, tag: str, seed: int) -> None:
    # The clients reconnect by themselves; the first lookups after may still see the outage, and
    # the first writes after a brick's restart can take longer than the bound for a while.
    rig.vol.wait_serving()
    rig.vol.wait_writable(within=BOUND_S / 4)
    time.sleep(2 * BOUND_S)
    out, doc = rig.run_bench(tag, 16, HEALTHY_RATE, seed)
    phase = measured(doc)
    assert phase["failed"] == 0 and "UCM store:" not in out, out
    assert decode_hit_rate(phase) > 0.9, phase["hit_rate"]  # decode loads what prefill stored


def test_healthy_run_hits_the_store(rig: Rig) -> None:
    out, doc = rig.run_bench("healthy", 16, HEALTHY_RATE, 1)
    phase = measured(doc)
    assert phase["failed"] == 0 and "UCM store:" not in out
    assert decode_hit_rate(phase) > 0.9


def test_brick_killed_mid_run(rig: Rig) -> None:
    def kill_then_restart() -> None:
        for pid in rig.vol.brick_pids():
            os.kill(pid, signal.SIGKILL)
        time.sleep(4)
        rig.vol.gluster("volume", "start", rig.vol.name, "force")

    out, doc = rig.run_bench("brick", 48, 4, 2, kill_then_restart)
    check_the_fault_run(rig, out, doc, 48, {"enotconn"})
    check_recovered(rig, "brick-after", 3)


def test_storage_host_link_cut_for_30_s(rig: Rig) -> None:
    out, doc = rig.run_bench("cut", 180, 4, 4, lambda: rig.vol.cut_server_link(30))
    # A cut hangs the mount's calls until the client gives the server up (ping-timeout, 5 s
    # here): lookups past the bound are timeouts, and what follows is ENOTCONN.
    check_the_fault_run(rig, out, doc, 180, {"timeout", "enotconn"})
    check_recovered(rig, "cut-after", 5)


def test_volume_stopped_and_started_mid_run(rig: Rig) -> None:
    during: list[str] = []

    def stop_then_start() -> None:
        rig.vol.gluster("volume", "stop", rig.vol.name, timeout=60)
        time.sleep(2)
        during.append(rig.cli("status", NAME).stdout)
        rig.vol.gluster("volume", "start", rig.vol.name)

    out, doc = rig.run_bench("stop", 48, 4, 6, stop_then_start)
    check_the_fault_run(rig, out, doc, 48, {"enotconn"})
    # `status` while the volume was stopped: each storage node's mount fails, with the reason
    (shown,) = during
    flat = " ".join(shown.split())
    gone = "fuse.glusterfs, FAILS (Transport endpoint is not connected)"
    for node in ("h1", "h2"):
        assert f"storage on {node}: {gone}" in flat, shown
    check_recovered(rig, "stop-after", 7)
    # and after: the mounts answer, the errors since start and the last one each server logged
    after = " ".join(rig.cli("status", NAME).stdout.split())
    assert "storage on h1: fuse.glusterfs, answers; errors since start: " in after, after
    assert "storage on h2: fuse.glusterfs, answers; errors since start: " in after
    assert "errors since start: none" not in after
    assert re.search(r"last in decode-0: .*UCM (lookup|load|save) error", after), after
