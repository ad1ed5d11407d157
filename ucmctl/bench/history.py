"""The results history: every `bench` run and suite, appended to one SQLite file with its
provenance, so that tonight's run can be read against last month's.

One row per run (its provenance, its provenance key, the whole saved result compressed) and one
row per measured cell (the figures a trend is drawn from), so that listing and trends read
small rows and never the documents. The provenance key is a digest of what must be equal for
two runs to be compared (`key_fields`): the topology and plan, the model, each node's platform,
engine, torch, device and image, and the workload's parameters (its seed included); not
ucmctl's version or revision (what a CI gate varies), the run's cache salt or prompt streams
(each run's own, so the prompts' digest is not in it either), the label or the time.

Several runs may append at once: SQLite serializes the writers (a busy wait of up to 60 s).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import re
import sqlite3
import time
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ucmctl.core.errors import UcmctlError
from ucmctl.topology.digest_compat import with_older

if TYPE_CHECKING:  # pydantic, which `ucmctl --help` and `bench history` need not import
    from ucmctl.bench.results import Cell

KIND = "ucmctl-bench-history"
SCHEMA_VERSION = 1
_SQLITE_MAGIC = b"SQLite format 3\x00"
# The figures kept per cell: (column, key in a measure phase).
FIGURES = (
    ("ttft_mean", "mean_ttft_ms"),
    ("ttft_p50", "median_ttft_ms"),
    ("ttft_p99", "p99_ttft_ms"),
    ("tpot_mean", "mean_tpot_ms"),
    ("tpot_p99", "p99_tpot_ms"),
    ("e2el_mean", "mean_e2el_ms"),
    ("e2el_p99", "p99_e2el_ms"),
    ("output_throughput", "output_throughput"),
    ("request_throughput", "request_throughput"),
)
METRICS = (*(c for c, _ in FIGURES), "hit_rate")
# Config keys that do not change what is measured (or are the run's own): not in the key.
_NOT_KEYED = {"cache_salt", "fail_fast", "timeout_s", "label", "sample_interval_s"}
_SCHEMA = f"""
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE runs (
    id INTEGER PRIMARY KEY,
    created_at REAL NOT NULL,
    command TEXT NOT NULL,
    deployment TEXT,
    workload TEXT NOT NULL,
    label TEXT,
    provenance_key TEXT NOT NULL,
    ucmctl_version TEXT,
    git_revision TEXT,
    failed INTEGER NOT NULL,
    lost INTEGER NOT NULL,
    key_fields TEXT NOT NULL,
    provenance TEXT NOT NULL,
    document BLOB NOT NULL
);
CREATE INDEX runs_by_time ON runs (created_at);
CREATE INDEX runs_by_key ON runs (provenance_key, created_at);
CREATE TABLE cells (
    run_id INTEGER NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
    cell TEXT NOT NULL,
    repeat INTEGER NOT NULL,
    {", ".join(f"{c} REAL" for c in METRICS)},
    failed INTEGER NOT NULL,
    lost INTEGER NOT NULL,
    PRIMARY KEY (run_id, cell, repeat)
);
"""


def default_path() -> Path:
    """$UCMCTL_HISTORY, else history.sqlite in ucmctl's home ($UCMCTL_HOME or ~/.ucmctl)."""
    if os.environ.get("UCMCTL_HISTORY"):
        return Path(os.environ["UCMCTL_HISTORY"])
    return Path(os.environ.get("UCMCTL_HOME") or Path.home() / ".ucmctl") / "history.sqlite"


def resolve(option: str | None) -> Path | None:
    """The history a run appends to: --history FILE, `off` for none, else the default."""
    if option is None:
        return default_path()
    return None if option == "off" else Path(option)


@dataclass(frozen=True)
class Run:
    id: int
    created_at: float
    command: str
    deployment: str | None
    workload: str
    label: str | None
    provenance_key: str
    ucmctl_version: str | None
    git_revision: str | None
    failed: int
    lost: int


@dataclass(frozen=True)
class CellRow:
    run_id: int
    cell: str
    repeat: int
    figures: dict[str, float | None]
    failed: int
    lost: int


def _refuse(path: Path, what: str, fix: str) -> UcmctlError:
    return UcmctlError.one(what, file=str(path), fix=fix)


def check(path: Path) -> None:
    """Refuse (exit 2, the file untouched) a history file that is not one, or one of a newer
    ucmctl: before a run, so its result is not lost at the end for want of a place."""
    with _connect(path, create=False):
        pass


@contextlib.contextmanager
def _connect(path: Path, *, create: bool) -> Iterator[sqlite3.Connection | None]:
    """The history's connection (None when it does not exist and `create` is false)."""
    if path.is_dir():
        raise _refuse(path, "is a folder, not a results history", "name a file, e.g. history.sqlite")
    exists = path.exists() and path.stat().st_size > 0
    if exists:
        try:
            with path.open("rb") as f:
                head = f.read(len(_SQLITE_MAGIC))
        except OSError as exc:
            raise _refuse(
                path, f"cannot read the results history: {exc.strerror}", "check its permissions"
            ) from None
        if head != _SQLITE_MAGIC:
            raise _refuse(
                path,
                "is not a results history (not an SQLite file)",
                "name another file with --history, or move this one away",
            )
    elif not create:
        yield None
        return
    else:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise _refuse(
                path, f"cannot create the results history: {exc.strerror}", "name another --history"
            ) from None
    try:
        db = sqlite3.connect(path, timeout=60, isolation_level=None)
    except sqlite3.Error as exc:
        raise _refuse(path, f"cannot open the results history: {exc}", "name another --history") from None
    try:
        db.execute("PRAGMA foreign_keys = ON")
        tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        if "meta" in tables:
            _check_schema(path, db)
        elif tables:
            raise _refuse(
                path,
                "is an SQLite file but not a results history of ucmctl",
                "name another file with --history",
            )
        elif create:
            _create(path, db)
        else:  # an empty file: nothing recorded yet
            yield None
            return
        yield db
    except sqlite3.DatabaseError as exc:
        raise _refuse(path, f"the results history cannot be read: {exc}", "name another --history") from None
    finally:
        db.close()


def _check_schema(path: Path, db: sqlite3.Connection) -> None:
    try:
        meta = dict(db.execute("SELECT key, value FROM meta").fetchall())
    except sqlite3.DatabaseError:
        meta = {}
    if meta.get("kind") != KIND:
        raise _refuse(
            path, "is an SQLite file but not a results history of ucmctl", "name another file with --history"
        )
    version = int(meta.get("schema_version", "0"))
    if version > SCHEMA_VERSION:
        raise _refuse(
            path,
            f"is a results history of a newer ucmctl (schema {version}; this one reads {SCHEMA_VERSION})",
            "use that ucmctl, or name another --history",
        )


def _create(path: Path, db: sqlite3.Connection) -> None:
    db.execute("BEGIN IMMEDIATE")  # two runs making it at once: the second finds it made
    try:
        if db.execute("SELECT name FROM sqlite_master WHERE name = 'meta'").fetchone() is None:
            for statement in filter(str.strip, _SCHEMA.split(";")):
                db.execute(statement)
            db.executemany(
                "INSERT INTO meta VALUES (?, ?)", [("kind", KIND), ("schema_version", str(SCHEMA_VERSION))]
            )
        db.execute("COMMIT")
    except BaseException:
        with contextlib.suppress(sqlite3.Error):
            db.execute("ROLLBACK")
        raise
    _check_schema(path, db)


# ---- what a run is keyed by -------------------------------------------------------------------
def key_fields(doc: dict[str, Any]) -> dict[str, Any]:
    """What must be equal for two runs to be compared, flat: `name: value`."""
    prov = doc.get("provenance") or {}
    config = with_older("bench", {"config": dict(doc.get("config") or {})})["config"]
    fields: dict[str, Any] = {
        "topology_digest": prov.get("topology_digest"),
        "plan_digest": prov.get("plan_digest"),
        "model": prov.get("model"),
        "engine": prov.get("engine"),
        "mode": prov.get("mode"),
    }
    if prov.get("url"):
        fields["url"] = prov["url"]
    for node, facts in sorted((prov.get("nodes") or {}).items()):
        for name, value in sorted(facts.items()):
            if name != "host":
                fields[f"{name}@{node}"] = value
    for name, value in sorted(config.items()):
        if name not in _NOT_KEYED:
            fields[f"config.{name}"] = value
    return fields


def provenance_key(fields: dict[str, Any]) -> str:
    text = json.dumps(fields, sort_keys=True, default=str, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _figure(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and math.isfinite(value) else None


def _cell_rows(cells: list[Cell]) -> list[tuple[str, int, dict[str, float | None], int, int]]:
    rows, seen = [], set()
    for cell in cells:
        measure = cell.measure
        if measure is None or not measure.given() or cell.aggregate:
            continue
        name = f"{cell.scenario or 'run'}/{cell.key()}"
        repeat = cell.repeat
        while (name, repeat) in seen:  # a cell named twice (never by this version): kept apart
            repeat += 1
        seen.add((name, repeat))
        figures = {column: _figure(measure.value(key)) for column, key in FIGURES}
        figures["hit_rate"] = _figure(measure.first_leg())
        rows.append((name, repeat, figures, measure.failed, len(measure.lost or [])))
    return rows


def record(
    path: Path, doc: dict[str, Any], *, command: str, deployment: str | None, label: str | None
) -> int:
    """Append a run (its saved result `doc`) and return its number."""
    prov = doc.get("provenance") or {}
    from ucmctl.bench.results import cells_of

    typed = cells_of(doc.get("cells") or [])  # the saved result's cells, read once
    cells = _cell_rows(typed)
    workloads = sorted({c.workload_name() for c in typed}) or ["prefix"]
    fields = key_fields(doc)
    blob = zlib.compress(json.dumps(doc, default=str, allow_nan=False).encode(), 6)
    with _connect(path, create=True) as db:
        assert db is not None
        db.execute("BEGIN IMMEDIATE")
        try:
            run_id = db.execute(
                "INSERT INTO runs (created_at, command, deployment, workload, label, provenance_key, "
                "ucmctl_version, git_revision, failed, lost, key_fields, provenance, document) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    time.time(),
                    command,
                    deployment,
                    ",".join(workloads),
                    label,
                    provenance_key(fields),
                    prov.get("ucmctl_version"),
                    prov.get("git_revision"),
                    sum(r[3] for r in cells),
                    sum(r[4] for r in cells),
                    json.dumps(fields, default=str),
                    json.dumps(prov, default=str),
                    blob,
                ),
            ).lastrowid
            columns = ", ".join(METRICS)
            db.executemany(
                f"INSERT INTO cells (run_id, cell, repeat, {columns}, failed, lost) "
                f"VALUES (?, ?, ?, {', '.join('?' * len(METRICS))}, ?, ?)",
                [
                    (run_id, name, repeat, *(figures[m] for m in METRICS), failed, lost)
                    for name, repeat, figures, failed, lost in cells
                ],
            )
            db.execute("COMMIT")
        except BaseException:
            with contextlib.suppress(sqlite3.Error):
                db.execute("ROLLBACK")
            raise
    assert run_id is not None
    return int(run_id)


# ---- reading ------------------------------------------------------------------------------
_SINCE = re.compile(r"^(\d+(?:\.\d+)?)([mhdw])$")


def parse_since(text: str, now: float | None = None) -> float:
    """`7d`, `12h`, `30m`, `2w` ago, or a date (2026-12-01) or time (2026-12-01T18:00) as epoch s."""
    now = time.time() if now is None else now
    m = _SINCE.match(text.strip())
    if m:
        return now - float(m.group(1)) * {"m": 60, "h": 3600, "d": 86400, "w": 604800}[m.group(2)]
    for fmt in ("%Y-%m-%d", "%Y-%m-%dT%H:%M", "%Y-%m-%dT%H:%M:%S", "%Y-%m-%d %H:%M"):
        with contextlib.suppress(ValueError):
            return time.mktime(time.strptime(text.strip(), fmt))
    raise UcmctlError.one(f"'{text}' is not a time", key="--since", fix="e.g. 7d, 12h, 2026-12-01")


@dataclass(frozen=True)
class Filter:
    deployment: str | None = None
    workload: str | None = None
    label: str | None = None
    since: float | None = None
    key: str | None = None
    last: int = 20


def runs(path: Path, f: Filter) -> list[Run]:
    """The last `f.last` runs that match, oldest first."""
    where: list[str] = []
    args: list[Any] = []
    for column, value in (("deployment", f.deployment), ("label", f.label)):
        if value is not None:
            where.append(f"{column} = ?")
            args.append(value)
    if f.key is not None:  # a prefix of it, as listed
        where.append("substr(provenance_key, 1, ?) = ?")
        args += [len(f.key), f.key]
    if f.workload is not None:
        where.append("(',' || workload || ',') LIKE ?")
        args.append(f"%,{f.workload},%")
    if f.since is not None:
        where.append("created_at >= ?")
        args.append(f.since)
    sql = (
        "SELECT id, created_at, command, deployment, workload, label, provenance_key, ucmctl_version, "
        "git_revision, failed, lost FROM runs"
        + (" WHERE " + " AND ".join(where) if where else "")
        + " ORDER BY id DESC LIMIT ?"
    )
    with _connect(path, create=False) as db:
        if db is None:
            return []
        rows = db.execute(sql, [*args, f.last]).fetchall()
    return [Run(*row) for row in reversed(rows)]


def cells(path: Path, run_ids: list[int]) -> list[CellRow]:
    if not run_ids:
        return []
    marks = ", ".join("?" * len(run_ids))
    with _connect(path, create=False) as db:
        if db is None:
            return []
        rows = db.execute(
            f"SELECT run_id, cell, repeat, {', '.join(METRICS)}, failed, lost FROM cells "
            f"WHERE run_id IN ({marks}) ORDER BY run_id, cell, repeat",
            run_ids,
        ).fetchall()
    n = len(METRICS)
    return [
        CellRow(r[0], r[1], r[2], dict(zip(METRICS, r[3 : 3 + n], strict=True)), r[3 + n], r[4 + n])
        for r in rows
    ]


def document(path: Path, run_id: int) -> dict[str, Any]:
    """The saved result of run `run_id` as `bench --save` wrote it."""
    with _connect(path, create=False) as db:
        found = None if db is None else db.execute("SELECT document FROM runs WHERE id = ?", (run_id,))
        row = None if found is None else found.fetchone()
    if row is None:
        raise UcmctlError.one(
            f"no run {run_id} in the results history",
            file=str(path),
            fix="`ucmctl bench history` lists the runs",
        )
    loaded: dict[str, Any] = json.loads(zlib.decompress(row[0]))
    return loaded
