"""Preflight of the storage backends: one filesystem shared by every storage node (the first one
writes a marker that the others must read back), writable there, taking O_DIRECT when the store
asks for it; and what each backend's filesystem and its mount options cost."""

from __future__ import annotations

import shlex
import uuid
from typing import TYPE_CHECKING

from ucmctl.deploy import filesystems
from ucmctl.nodes.executor import Executor
from ucmctl.nodes.fanout import parallel
from ucmctl.plan.model import Plan

if TYPE_CHECKING:
    from ucmctl.deploy.preflight import NodeFacts


class SharedCheck:
    """The storage backend must be one shared filesystem: the first storage node writes a marker
    (inside its facts round trip), every other storage node must read it back."""

    def __init__(self, plan: Plan) -> None:
        self.backends = list(plan.store.backends) if plan.store else []
        self.io_direct = plan.store.io_direct if plan.store else False
        self.pack_blocks = plan.store.pack_blocks if plan.store else 1
        nodes = plan.store_nodes()
        self.writer = nodes[0] if nodes and self.backends else None
        self.readers = nodes[1:]
        self.token = uuid.uuid4().hex
        self.markers = [f"{b}/.ucmctl-shared-check-{self.token}" for b in self.backends]
        self.cleanup: dict[str, list[str]] = {}

    def write_lines(self) -> str:
        """Shell for the writer's facts round trip: `sharedI=ok`, or `sharedI=<the error>`."""
        lines = [""]
        for i, (backend, marker) in enumerate(zip(self.backends, self.markers, strict=True)):
            made = f"mkdir -p {shlex.quote(backend)} && echo {self.token} > {shlex.quote(marker)}"
            lines.append(_ok_or_error(f"shared{i}", made))
            # O_DIRECT with the store's alignment (4 KiB pages): one page written, then removed
            probe = shlex.quote(f"{marker}.direct")
            lines.append(
                f"if dd if=/dev/zero of={probe} bs=4096 count=1 oflag=direct 2>/dev/null; "
                f"then echo direct{i}=1; else echo direct{i}=0; fi; rm -f {probe}"
            )
        return "\n".join(lines) + "\n"

    def filesystems(self, results: list[NodeFacts]) -> tuple[list[str], list[str]]:
        """Each backend's filesystem on the storage nodes (one line each), and what its mounts cost."""
        notes: list[str] = []
        warnings: list[str] = []
        for i, backend in enumerate(self.backends):
            seen = {r.node: m for r in results if (m := filesystems.parse(r.facts, i)) is not None}
            writer = next((r for r in results if r.node == self.writer), None)
            # the O_DIRECT probe says something only where the marker could be written
            wrote = writer is not None and writer.facts.get(f"shared{i}") == "ok"
            direct = writer.facts.get(f"direct{i}") if writer is not None and wrote else None
            if seen:
                said = {"1": "yes", "0": "no (the store uses buffered I/O there)"}.get(direct or "")
                notes.append(filesystems.summary(backend, seen) + (f"; O_DIRECT: {said}" if said else ""))
            for node, m in seen.items():
                warnings += filesystems.warnings(node, backend, m)
            warnings += filesystems.file_per_block(backend, seen, self.pack_blocks)
        return notes, warnings

    def judge(self, writer: NodeFacts, executors: dict[str, Executor], *, all_reachable: bool) -> list[str]:
        assert self.writer is not None
        written = [i for i in range(len(self.backends)) if writer.facts.get(f"shared{i}") == "ok"]
        if written:
            self.cleanup[self.writer] = ["rm -f " + " ".join(shlex.quote(self.markers[i]) for i in written)]
        problems = [
            _cannot_write(self.writer, b, why)
            for i, b in enumerate(self.backends)
            if writer.facts and i not in written
            for why in [writer.facts.get(f"shared{i}", "").strip()]
        ]
        problems += [
            f"node {self.writer}: storage backend {self.backends[i]} refuses O_DIRECT writes (a 4 KiB "
            "page, the store's alignment) but storage.io_direct is true: set storage.io_direct: false "
            "(buffered I/O), or put the store on a filesystem that takes O_DIRECT"
            for i in written
            if self.io_direct and writer.facts.get(f"direct{i}") == "0"
        ]
        if not all_reachable or not written:
            return problems
        read = self.read_lines(written)
        seen = parallel(self.readers, lambda n: executors[n].run(read).stdout)
        for name, out in zip(self.readers, seen, strict=True):
            facts = dict(line.partition("=")[::2] for line in out.splitlines())
            for i in written:
                if facts.get(f"seen{i}", "").strip() != self.token:
                    problems.append(
                        f"node {name}: storage backend {self.backends[i]} is not the filesystem node "
                        f"{self.writer} wrote to: mount the same shared storage (NFS, 3FS) at "
                        f"{self.backends[i]} on every node"
                    )
                elif (why := facts.get(f"wrote{i}", "").strip()) != "ok":
                    # every store user writes: blocks, and a corrupt block moved aside
                    problems.append(_cannot_write(name, self.backends[i], why))
        return problems

    def read_lines(self, written: list[int]) -> str:
        """Shell for the other nodes: `seenI=<the marker's token>`, and `wroteI=ok` or the error
        of writing (and removing) a probe file beside the marker."""
        lines = []
        for i in written:
            probe = shlex.quote(f"{self.markers[i]}.w") + '"$$"'  # this shell's own name
            lines.append(f'echo "seen{i}=$(cat {shlex.quote(self.markers[i])} 2>/dev/null)"')
            lines.append(_ok_or_error(f"wrote{i}", f": > {probe} && rm -f {probe}"))
        return "\n".join(lines) + "\n"


def _ok_or_error(fact: str, command: str) -> str:
    """Shell that prints `FACT=ok` if `command` succeeds, else `FACT=<its error on one line>`."""
    one_line = "$(printf %s \"$err\" | tr '\\n' ' ')"
    failed = f"printf '{fact}=%s\\n' \"{one_line}\""
    return f"if err=$( {{ {command}; }} 2>&1 ); then echo {fact}=ok; else {failed}; fi"


def _cannot_write(node: str, backend: str, why: str) -> str:
    """One line for a storage folder the node could not write, with the fix from the shell's words."""
    if "Read-only file system" in why:
        fix = "the filesystem is mounted read-only there: remount it read-write, or choose another path"
    elif "Permission denied" in why:
        fix = "let the user ucmctl logs in as write there, or choose another path"
    else:
        fix = "make the folder (or its parent) writable on that node, or choose another path"
    return f"node {node}: cannot write to storage backend {backend}: {why}: {fix}"
