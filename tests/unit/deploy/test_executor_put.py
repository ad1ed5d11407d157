"""Writes of one path from several places at once (nodes sharing a filesystem, as `install
--wheel` does): every write completes and the file holds one whole version, never a mix."""

from __future__ import annotations

import threading
from pathlib import Path

from ucmctl.nodes.executor import LocalExecutor
from ucmctl.plan.model import NodePlan


def test_concurrent_puts_of_one_path_all_complete(tmp_path: Path) -> None:
    plan = NodePlan(name="local", host="localhost", transport="local", user="me", ssh_port=22, key=None,
                    platform="cpu", devices=0, python="python3", run_dir=str(tmp_path),
                    bind="127.0.0.1")  # fmt: skip
    target = tmp_path / "wheels" / "pkg.whl"
    versions = [bytes([i]) * 200_000 for i in range(8)]
    errors: list[OSError] = []

    def put(start: threading.Barrier, data: bytes) -> None:
        start.wait()
        try:
            LocalExecutor(plan).put(str(target), data)
        except OSError as exc:
            errors.append(exc)

    for _ in range(20):
        start = threading.Barrier(len(versions))
        threads = [threading.Thread(target=put, args=(start, v)) for v in versions]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert errors == []
        assert target.read_bytes() in versions
    assert sorted(p.name for p in target.parent.iterdir()) == ["pkg.whl"]  # no temp file left
