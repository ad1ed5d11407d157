"""The rendered objects as files, one per object, each under a header that marks it as written
by `ucmctl render --k8s` (what a later render may replace, and what it must not touch)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from ucmctl.core.errors import UcmctlError
from ucmctl.plan.model import Plan

HEADER_MARK = "# Rendered by `ucmctl render --k8s`"


@dataclass
class Manifest:
    filename: str
    obj: dict[str, Any]


class _Dumper(yaml.SafeDumper):
    pass


def _text(dumper: yaml.SafeDumper, value: str) -> yaml.Node:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _text)


def manifest_text(m: Manifest, plan: Plan) -> str:
    header = (
        f"{HEADER_MARK} from topology {plan.deployment} (digest {plan.topology_digest[:12]}):\n"
        "# ucmctl does not run it. Apply the folder with `kubectl apply -f DIR`, remove it with\n"
        "# `kubectl delete -f DIR`. The topology's node names and hosts are not used on Kubernetes:\n"
        "# the scheduler places the pods.\n"
    )
    return header + yaml.dump(m.obj, Dumper=_Dumper, sort_keys=False, allow_unicode=True, width=100)


def _ours(path: Path) -> bool:
    try:
        with path.open(encoding="utf-8") as f:
            return f.read(len(HEADER_MARK)) == HEADER_MARK
    except (OSError, UnicodeDecodeError):
        return False


def _foreign(folder: Path) -> Iterator[Path]:
    for path in sorted(folder.iterdir()):
        if path.suffix in (".yaml", ".yml", ".json") and not _ours(path):
            yield path


def write_manifests(manifests: list[Manifest], plan: Plan, folder: Path) -> list[Path]:
    """Write one file per object; files an earlier render wrote there and this one does not are
    removed (`kubectl apply -f DIR` would apply them too). A folder that holds other manifests
    is refused."""
    if folder.exists() and not folder.is_dir():
        raise UcmctlError.one(f"--k8s {folder}: not a folder")
    folder.mkdir(parents=True, exist_ok=True)
    foreign = list(_foreign(folder))
    if foreign:
        raise UcmctlError.one(
            f"--k8s {folder}: holds manifests ucmctl did not write ({foreign[0].name}"
            + (f" and {len(foreign) - 1} more" if len(foreign) > 1 else "")
            + "): `kubectl apply -f` would apply them too",
            fix="use an empty folder",
        )
    names = {m.filename for m in manifests}
    for old in folder.iterdir():
        if old.suffix == ".yaml" and old.name not in names and _ours(old):
            old.unlink()
    written = []
    for m in manifests:
        path = folder / m.filename
        path.write_text(manifest_text(m, plan), encoding="utf-8")
        written.append(path)
    return written
