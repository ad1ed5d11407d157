"""Staging a node's files in one round trip, refusing when this deployment already runs there.

Every SSH command starts the login shell of the node's user (with its rc files: on a
cluster node often a conda or pyenv set-up costing a good fraction of a second of CPU), so
`up` asks each node as few times as it can: this one command removes preflight markers,
checks the pidfiles of the node's processes, creates the folders and writes every file
(each to a temp name, then renamed into place).
"""

from __future__ import annotations

import base64
import posixpath
import shlex
import uuid

from ucmctl.nodes import lifecycle
from ucmctl.nodes.executor import Executor, NodeError
from ucmctl.plan.model import PlacedFile, Process

# A command line is one argument of `sh -c` (at most 128 KiB on Linux): larger file sets go
# over the executor's put after this command.
INLINE_LIMIT = 64 * 1024


def stage_node(ex: Executor, processes: list[Process], before: list[str] | None = None) -> list[str]:
    """Run `before`, then write the processes' files unless one of them is running already.

    Returns the names of the processes found running (nothing was written then)."""
    files = [f for p in processes for f in p.files]
    dirs = sorted({posixpath.dirname(f.path) for f in files})
    inline = sum(len(f.content) for f in files) * 4 // 3 < INLINE_LIMIT
    script = "\n".join(
        [
            *(before or []),
            f"running=$({lifecycle.running_lines(processes)}\n)",
            'if [ -n "$running" ]; then echo "$running"; exit 0; fi',
            *(["mkdir -p " + " ".join(shlex.quote(d) for d in dirs) + " || exit 5"] if dirs else []),
            *(_write(f) for f in (files if inline else [])),
            "echo staged",
        ]
    )
    done = ex.run(script, timeout=60)
    running = [line.split(" ", 1)[1] for line in done.stdout.splitlines() if line.startswith("running ")]
    if running:
        return running
    if not done.ok or "staged" not in done.stdout.split():
        raise NodeError(ex.node.name, f"cannot stage files: {done.stderr.strip() or done.stdout.strip()}")
    if not inline:
        for f in files:
            ex.put(f.path, f.content, f.mode)
    return []


def _write(f: PlacedFile) -> str:
    # A temp name of its own per write: two stagings of one path (two `up`s racing, nodes on one
    # shared filesystem) must not rename or chmod each other's half-written file.
    path, tmp = shlex.quote(f.path), shlex.quote(f"{f.path}.{uuid.uuid4().hex[:12]}.staging")
    b64 = base64.b64encode(f.content.encode()).decode()
    write = f"printf %s {b64} | base64 -d > {tmp} && chmod {f.mode:o} {tmp} && mv -f {tmp} {path}"
    return f"{{ {write}; }} || exit 5"
