"""The wheel of the ucmctl that runs here, made from its installed files, byte for byte the same
for the same files (sorted entries, fixed times), so its digest names what a derived image holds.

It carries ucmctl, the connector (ucm_connector) and the native store (ucm_store, compiled for
this machine's Python: its tag is the installed wheel's) and no dependencies: the image's engine
brings what the connector needs.
"""

from __future__ import annotations

import base64
import hashlib
import importlib.metadata
import io
import zipfile
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from ucmctl.plan.render import templates_dir

PACKAGES = ("ucmctl", "ucm_connector", "ucm_store")
_EPOCH = (1980, 1, 1, 0, 0, 0)


@dataclass(frozen=True)
class Wheel:
    filename: str
    data: bytes

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.data).hexdigest()


def _tag() -> str:
    try:
        text = importlib.metadata.distribution("ucmctl").read_text("WHEEL") or ""
    except importlib.metadata.PackageNotFoundError:
        text = ""
    tags = [line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("Tag:")]
    if tags:
        return tags[0]
    import sys
    import sysconfig

    py = f"cp{sys.version_info[0]}{sys.version_info[1]}"
    return f"{py}-{py}-{sysconfig.get_platform().replace('-', '_').replace('.', '_')}"


def _files() -> dict[str, bytes]:
    """Archive path -> content, for every installed file of the packages (no caches)."""
    import importlib

    out: dict[str, bytes] = {}
    for name in PACKAGES:
        module = importlib.import_module(name)
        for root in [Path(p) for p in module.__path__]:
            for path in sorted(root.rglob("*")):
                rel = path.relative_to(root)
                if not path.is_file() or "__pycache__" in rel.parts or path.suffix == ".pyc":
                    continue
                if name == "ucmctl" and rel.parts[0] == "_templates":
                    continue  # the templates this ucmctl reads, below
                out.setdefault(f"{name}/{rel.as_posix()}", path.read_bytes())
    for path in sorted(templates_dir().glob("*.j2")):
        out[f"ucmctl/_templates/{path.name}"] = path.read_bytes()
    return out


def _record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


@cache
def installed_wheel() -> Wheel:
    version = importlib.metadata.version("ucmctl")
    tag = _tag()
    info = f"ucmctl-{version}.dist-info"
    files = _files()
    files[f"{info}/METADATA"] = f"Metadata-Version: 2.1\nName: ucmctl\nVersion: {version}\n".encode()
    files[f"{info}/WHEEL"] = (
        f"Wheel-Version: 1.0\nGenerator: ucmctl image build\nRoot-Is-Purelib: false\nTag: {tag}\n"
    ).encode()
    record = "".join(f"{p},{_record_hash(d)},{len(d)}\n" for p, d in sorted(files.items()))
    files[f"{info}/RECORD"] = (record + f"{info}/RECORD,,\n").encode()
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as zf:
        for path in sorted(files):
            entry = zipfile.ZipInfo(path, date_time=_EPOCH)
            entry.external_attr = (0o755 if path.endswith(".so") else 0o644) << 16
            entry.compress_type = zipfile.ZIP_DEFLATED
            zf.writestr(entry, files[path])
    return Wheel(f"ucmctl-{version}-{tag}.whl", buffer.getvalue())
