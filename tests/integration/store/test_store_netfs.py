"""The store on a real network filesystem (a GlusterFS volume of the test hosts): blocks stored
through one host's client are read right through another's, and when the server goes (its brick
process killed) a load is a miss counted by its kind, with no byte delivered, until it is back."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import gluster
from tests.support.netns import cluster_or_skip

pytestmark = [pytest.mark.slow, pytest.mark.root]
CLIENT = Path(__file__).with_name("netfs_client.py")
COUNT = 24


@pytest.fixture(scope="module")
def volume() -> Iterator[gluster.Volume]:
    if reason := gluster.available():
        pytest.skip(reason)
    with cluster_or_skip(3) as hosts, gluster.gluster_volume(hosts, server="h3", clients=["h1", "h2"]) as vol:
        yield vol


def client(vol: gluster.Volume, host: str, op: str) -> dict:
    done = vol.on(host, sys.executable, str(CLIENT), op, str(vol.mount / "kv"), str(COUNT), timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.splitlines()[-1])


def test_blocks_cross_hosts_and_a_lost_server_is_a_counted_miss(volume: gluster.Volume) -> None:
    assert client(volume, "h1", "dump") == {"stored": COUNT}
    read = client(volume, "h2", "load")
    assert read["loaded"] == read["right"] == COUNT, read  # h2's client, h1's blocks, right bytes
    assert read["stats"]["posix_read_errors"] == 0

    for pid in volume.brick_pids():
        os.kill(pid, signal.SIGKILL)
    lost = client(volume, "h2", "load")
    assert lost["loaded"] == 0 and lost["untouched"] == COUNT, lost  # a miss each, no byte written
    stats = lost["stats"]
    assert stats["load_errors"] == stats["posix_read_errors"] == COUNT, lost
    assert stats["posix_read_enotconn"] == COUNT, lost  # the kind a server that is gone gives
    assert any("Transport endpoint is not connected" in r for r in lost["reasons"]), lost

    volume.gluster("volume", "start", volume.name, "force")
    deadline = time.monotonic() + 30
    while (back := client(volume, "h2", "load"))["loaded"] < COUNT and time.monotonic() < deadline:
        time.sleep(0.5)
    assert back["loaded"] == back["right"] == COUNT, back  # the client reconnected by itself
