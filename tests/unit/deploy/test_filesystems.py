"""Preflight's view of the storage backends' filesystems (ucmctl/deploy/filesystems.py): the probe
run by a real shell on this machine, and what each mount's settings are judged to cost."""

from __future__ import annotations

import subprocess
from pathlib import Path

from ucmctl.deploy.filesystems import (
    Mounted,
    client_timeouts,
    file_per_block,
    parse,
    probe_lines,
    summary,
    warnings,
)


def facts_of(script: str) -> dict[str, str]:
    done = subprocess.run(["sh", "-c", script], capture_output=True, text=True, check=True)
    return dict(line.partition("=")[::2] for line in done.stdout.splitlines() if "=" in line)


def test_the_probe_reads_the_mount_of_a_folder_not_made_yet(tmp_path: Path) -> None:
    odd = tmp_path / "kv 'quoted' $HOME" / "not" / "yet"
    facts = facts_of(probe_lines([str(odd), "/proc/self"]))
    argv = ["findmnt", "-n", "-o", "FSTYPE", "-T", str(tmp_path)]
    here = subprocess.run(argv, capture_output=True, text=True)
    first, proc = parse(facts, 0), parse(facts, 1)
    assert first is not None and first.type == here.stdout.split()[0] and first.client == ""
    assert proc is not None and proc.type == "proc" and proc.target == "/proc" and "rw" in proc.options
    assert parse(facts, 2) is None


def test_a_glusterfs_client_with_default_caching_is_a_warning_with_the_fix() -> None:
    client = "/usr/sbin/glusterfs --volfile-server=10.0.0.3 --volfile-id=kv --entry-timeout=0 /mnt/kv "
    timeouts = client_timeouts(client)
    assert timeouts == {"entry-timeout": 0.0, "attribute-timeout": 1.0, "negative-timeout": 0.0}
    m = Mounted("fuse.glusterfs", "/mnt/kv", ("rw",), client)
    (line,) = warnings("h2", "/mnt/kv/store", m)
    assert line.startswith("node h2: storage backend /mnt/kv/store is on GlusterFS with attribute-timeout 1")
    assert line.endswith("entry-timeout=0,attribute-timeout=0,negative-timeout=0 (docs/storage.md)")
    coherent = client.replace("--entry-timeout=0", "--entry-timeout=0 --attribute-timeout=0")
    assert warnings("h2", "/mnt/kv", Mounted("fuse.glusterfs", "/mnt/kv", (), coherent)) == []
    assert "could not be read" in warnings("h2", "/mnt/kv", Mounted("fuse.glusterfs", "/mnt/kv", ()))[0]


def test_nfs_lookup_caching_and_local_filesystems() -> None:
    default = Mounted("nfs4", "/shared", ("rw", "vers=4.2", "actimeo=0"))
    assert "lookupcache=all" in warnings("n1", "/shared/kv", default)[0]
    assert warnings("n1", "/shared/kv", Mounted("nfs4", "/shared", ("rw", "lookupcache=positive"))) == []
    assert warnings("n1", "/data/kv", Mounted("ext4", "/", ("rw",))) == []
    assert Mounted("fuse.hf3fs", "/3fs", ()).shared_kind == "3FS" and default.shared_kind == "NFS"
    seen = {"h1": Mounted("fuse.glusterfs", "/m", ()), "h2": Mounted("fuse.glusterfs", "/m", ()),
            "h3": Mounted("ext4", "/", ())}  # fmt: skip
    assert summary("/m/kv", seen) == "storage /m/kv: fuse.glusterfs on h1, h2; ext4 on h3"


def test_the_volumes_client_caches_are_read_from_the_clients_graph() -> None:
    graph = ("t2p2d", "t2p2d-client-0", "t2p2d-dht", "t2p2d-md-cache", "t2p2d-quick-read", "meta-autoload")
    timeouts = "glusterfs --entry-timeout=0 --attribute-timeout=0 --negative-timeout=0 /m "
    (line,) = warnings("h1", "/m/kv", Mounted("fuse.glusterfs", "/m", (), timeouts, graph))
    assert "volume t2p2d with performance.quick-read, performance.stat-prefetch on" in line
    assert "gluster volume set t2p2d performance.quick-read off; gluster volume set t2p2d " in line
    assert warnings("h1", "/m/kv", Mounted("fuse.glusterfs", "/m", (), timeouts, graph[:3])) == []


def test_a_file_per_block_on_a_network_filesystem_is_one_warning_per_backend() -> None:
    gluster, ext4 = Mounted("fuse.glusterfs", "/m", ()), Mounted("ext4", "/", ())
    (line,) = file_per_block("/m/kv", {"h1": gluster, "h2": gluster, "h3": ext4}, pack_blocks=1)
    assert line.startswith("storage backend /m/kv is on GlusterFS with a file per KV block (storage.pack")
    assert line.endswith("so a pack holds 16-64 MiB of a rank's blocks (docs/storage.md)")
    nfs = Mounted("nfs4", "/shared", ("rw",))
    assert "is on GlusterFS/NFS with" in file_per_block("/kv", {"a": gluster, "b": nfs}, 1)[0]
    assert file_per_block("/m/kv", {"h1": gluster}, pack_blocks=4) == []  # packs: nothing to say
    assert file_per_block("/data/kv", {"h1": ext4, "h2": ext4}, pack_blocks=1) == []  # a local disk
