"""The GlusterFS volume of the test hosts (tests/support/gluster.py) is a network filesystem
behind each host's own client: what one host renames into place another reads at once, the
machine's own namespace does not see it, and nothing is left afterwards."""

from __future__ import annotations

import subprocess

import pytest

from tests.support import gluster
from tests.support.netns import cluster_or_skip

pytestmark = [pytest.mark.slow, pytest.mark.root]
SHARES = "gluster"  # glusterd: one module at a time (tests/support/fixtures.py)


def test_a_volume_served_by_one_host_and_mounted_on_the_others() -> None:
    if reason := gluster.available():
        pytest.skip(reason)
    with cluster_or_skip(3) as hosts:
        with gluster.gluster_volume(hosts, server="h3", clients=["h1", "h2"]) as vol:
            assert vol.fs_type("h1") == vol.fs_type("h2") == "fuseblk"
            assert vol.fs_type("h3") != "fuseblk"  # the server is no client
            here = subprocess.run(["stat", "-f", "-c", "%T", str(vol.mount)], capture_output=True, text=True)
            assert here.stdout.strip() != "fuseblk"  # each host's own mount namespace
            # a block-sized file renamed over an older one on h1: h2's next read has the new bytes
            for i in range(20):
                data = f"{i:04d}" * 1024
                write = f"printf %s {data} > {vol.mount}/b.tmp && mv {vol.mount}/b.tmp {vol.mount}/b"
                assert vol.on("h1", "sh", "-c", write).returncode == 0
                read = vol.on("h2", "cat", f"{vol.mount}/b")
                assert read.returncode == 0 and read.stdout == data, (i, read.stderr)
            assert (vol.brick / "b").read_text() == data  # on the server's brick
            assert not (vol.mount / "b").exists()  # and not on this machine's disk
            assert vol.brick_pids()
            assert vol.gluster("volume", "info", "kv").stdout.count("performance.quick-read: off") == 1
            mount = vol.mount
        # gone: the clients, the brick, glusterd, the mount points
        left = subprocess.run(["pgrep", "-f", f"gluster.*{hosts.base}"], capture_output=True, text=True)
        assert left.stdout == "" and not mount.exists()
