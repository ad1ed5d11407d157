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
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.support import gluster
from tests.support.netns import cluster_or_skip
from tests.unit.store.blocks import key

pytestmark = [pytest.mark.slow, pytest.mark.root]
CLIENT = Path(__file__).with_name("netfs_client.py")
COUNT = 24


@pytest.fixture(scope="module")
def volume() -> Iterator[gluster.Volume]:
    if reason := gluster.available():
        pytest.skip(reason)
    with cluster_or_skip(3) as hosts, gluster.gluster_volume(hosts, server="h3", clients=["h1", "h2"]) as vol:
        yield vol


def client(vol: gluster.Volume, host: str, op: str, *more: str) -> dict:
    done = vol.on(
        host, sys.executable, str(CLIENT), op, str(vol.mount / "kv"), str(COUNT), *more, timeout=180
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.splitlines()[-1])


def test_two_hosts_storing_the_same_blocks_at_once_leave_one_whole_block_each(volume: gluster.Volume) -> None:
    """Prefill servers on two nodes completing the same prefix: both stores succeed, one file per
    key remains, and a reader polling meanwhile never gets a torn or wrong block."""
    with ThreadPoolExecutor(3) as pool:
        reader = pool.submit(client, volume, "h1", "poll", "race", "6")
        time.sleep(0.5)  # the reader is polling before the first write
        writers = [pool.submit(client, volume, host, "dump", "race") for host in ("h1", "h2")]
        assert [w.result() for w in writers] == [{"stored": COUNT}] * 2
        polled = reader.result()
    assert polled["passes"] > 1 and polled["right"] == polled["delivered"], polled  # nothing wrong
    names = [f.name for f in (volume.brick / "kv").rglob("*") if f.is_file()]
    assert not [n for n in names if ".tmp." in n], names  # every writer's temp file renamed or gone
    read = client(volume, "h2", "load", "race")
    assert read["loaded"] == read["right"] == COUNT, read
    # exactly one file per key of the race, named by its key
    race = {key(i, "race").hex() for i in range(COUNT)}
    assert sorted(n for n in names if n in race) == sorted(race)


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
