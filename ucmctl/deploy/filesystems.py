"""What filesystem each storage backend is on, on each node, and what its mount costs this store.

The store's blocks are named by their content (a key is a digest of the tokens before it) and
put into place whole (temporary file, then rename), so a name never holds other bytes: a client
that caches names and attributes makes a block stored by another node visible late (a miss, then
a recompute), never wrong. Those settings are warnings, with the fix; the store's integrity check
is the last word on the bytes. See docs/storage.md.

The probe is shell for the preflight round trip: per backend, `fsI=TYPE TARGET OPTIONS` of the
mount the folder (or its nearest existing parent) is on, and for a GlusterFS FUSE mount
`clientI=` the command line of its glusterfs client in this mount namespace (the timeouts are
its options, not the mount table's).
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass

_PROBE_FUNCTIONS = r"""
ucm_fs() { d=$1; while [ ! -e "$d" ]; do d=$(dirname "$d"); done
  findmnt -n -o FSTYPE,TARGET,OPTIONS -T "$d" 2>/dev/null | head -1 | grep . || stat -f -c '%T - -' "$d"; }
ucm_gluster_client() { me=$(readlink /proc/self/ns/mnt)
  for p in /proc/[0-9]*; do
    [ "$(readlink "$p/ns/mnt" 2>/dev/null)" = "$me" ] || continue
    c=$(tr '\0' ' ' < "$p/cmdline" 2>/dev/null)
    case "$c" in *glusterfs*" $1 ") echo "$c"; return;; esac
  done; }
ucm_gluster_graph() { ls "$1/.meta/graphs/active" 2>/dev/null | tr '\n' ' '; }
"""

# GlusterFS's FUSE client defaults (glusterfs(8)) and NFS's (nfs(5)), in seconds.
GLUSTER_DEFAULTS = {"entry-timeout": 1.0, "attribute-timeout": 1.0, "negative-timeout": 0.0}
GLUSTER_COHERENT = "entry-timeout=0,attribute-timeout=0,negative-timeout=0"
# The volume's client-side caches (translators in the client's graph) and the options that load them.
GLUSTER_VOLUME_CACHES = {
    "quick-read": "performance.quick-read",
    "open-behind": "performance.open-behind",
    "md-cache": "performance.stat-prefetch",
}


@dataclass(frozen=True)
class Mounted:
    """The mount a backend folder is on, as one node sees it."""

    type: str  # findmnt's FSTYPE: ext4, xfs, nfs4, fuse.glusterfs, fuse.3fs ...
    target: str
    options: tuple[str, ...]
    client: str = ""  # a FUSE mount's client command line, where known
    xlators: tuple[str, ...] = ()  # GlusterFS: the client's translators (its .meta/graphs/active)

    @property
    def shared_kind(self) -> str | None:
        """The network filesystem it is, or None (a local one, or one not known here)."""
        if self.type in ("nfs", "nfs4"):
            return "NFS"
        if self.type == "fuse.glusterfs":
            return "GlusterFS"
        if "3fs" in self.type or "hf3fs" in self.type:
            return "3FS"
        return None


def probe_lines(backends: list[str]) -> str:
    """Shell for a node's facts round trip: one `fsI=` (and, for GlusterFS, `clientI=`) per backend."""
    lines = [_PROBE_FUNCTIONS]
    for i, b in enumerate(backends):
        q = shlex.quote(b)
        lines.append(f'm=$(ucm_fs {q}); echo "fs{i}=$m"')
        lines.append(
            f'case "$m" in fuse.glusterfs*) t=${{m#* }}; t=${{t%% *}}; '
            f'echo "client{i}=$(ucm_gluster_client "$t")"; '
            f'echo "xlators{i}=$(ucm_gluster_graph "$t")";; esac'
        )
    return "\n".join(lines) + "\n"


def parse(facts: dict[str, str], i: int) -> Mounted | None:
    """Backend `i`'s mount from a node's facts; None when the probe said nothing."""
    words = facts.get(f"fs{i}", "").split()
    if not words:
        return None
    target = words[1] if len(words) > 1 else "-"
    options = tuple(words[2].split(",")) if len(words) > 2 and words[2] != "-" else ()
    xlators = tuple(facts.get(f"xlators{i}", "").split())
    return Mounted(words[0], target, options, facts.get(f"client{i}", "").strip(), xlators)


def client_timeouts(client: str) -> dict[str, float]:
    """A glusterfs client's entry, attribute and negative timeouts (its options, else the defaults)."""
    out = dict(GLUSTER_DEFAULTS)
    for word in client.split():
        key, _, value = word.removeprefix("--").partition("=")
        if key in out:
            try:
                out[key] = float(value)
            except ValueError:
                continue
    return out


def _volume_caches(xlators: tuple[str, ...]) -> tuple[str, list[str]]:
    """The volume's name and the options of the client caches its graph loads (`VOL-quick-read`...)."""
    volume, options = "", []
    for x in xlators:
        for suffix, option in GLUSTER_VOLUME_CACHES.items():
            if x.endswith(f"-{suffix}"):
                volume = x.removesuffix(f"-{suffix}")
                options.append(option)
    return volume, sorted(options)


def warnings(node: str, backend: str, m: Mounted) -> list[str]:
    """What the mount costs: settings that make another node's blocks seen late (misses)."""
    where = f"node {node}: storage backend {backend}"
    out: list[str] = []
    if m.type == "fuse.glusterfs":
        volume, options = _volume_caches(m.xlators)
        if options:
            fix = "; ".join(f"gluster volume set {volume} {o} off" for o in options)
            out.append(
                f"{where} is on GlusterFS volume {volume} with {', '.join(options)} on: a block "
                f"replaced on another node is read stale for about a second; {fix} "
                "(docs/storage.md)"
            )
        if not m.client:
            out.append(
                f"{where} is on GlusterFS, but its client's options could not be read (another "
                f"mount namespace?): mount with {GLUSTER_COHERENT}"
            )
            return out
        cached = {k: v for k, v in client_timeouts(m.client).items() if v > 0}
        if cached:
            said = ", ".join(f"{k} {v:g} s" for k, v in cached.items())
            out.append(
                f"{where} is on GlusterFS with {said}: a block another node stored is missed for up "
                f"to that long; mount with {GLUSTER_COHERENT} (docs/storage.md)"
            )
    if m.shared_kind == "NFS":
        opts = dict(o.partition("=")[::2] for o in m.options)
        if opts.get("lookupcache") not in ("none", "pos", "positive"):
            out.append(
                f"{where} is on NFS with lookupcache={opts.get('lookupcache') or 'all'}: a block "
                "another node stored is missed until the client's cache expires; mount with "
                "lookupcache=positive (docs/storage.md)"
            )
    return out


def file_per_block(backend: str, seen: dict[str, Mounted], pack_blocks: int) -> list[str]:
    """What a file per block costs on a network filesystem: one line, whichever nodes mount it."""
    kinds = sorted({k for m in seen.values() if (k := m.shared_kind)})
    if pack_blocks > 1 or not kinds:
        return []
    return [
        f"storage backend {backend} is on {'/'.join(kinds)} with a file per KV block "
        "(storage.pack_blocks 1): blocks under a few MiB move at a fraction of the mount's rate "
        "through its client (256 KiB: 0.12x dd writing, 0.55x reading, measured on GlusterFS); "
        "set storage.pack_blocks so a pack holds 16-64 MiB of a rank's blocks (docs/storage.md)"
    ]


def summary(backend: str, seen: dict[str, Mounted]) -> str:
    """One line: the backend's filesystem on every node (grouped when they agree)."""
    by_type: dict[str, list[str]] = {}
    for node, m in seen.items():
        by_type.setdefault(m.type, []).append(node)
    parts = [f"{t} on {', '.join(nodes)}" for t, nodes in by_type.items()]
    return f"storage {backend}: {'; '.join(parts)}"
