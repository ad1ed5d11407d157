#!/usr/bin/env bash
# Set up everything the tests need on a fresh machine (scripts/setup.sh --engine --tests: the real
# vLLM for the CPU, the test infrastructure, the development tools), then run the tests.
#   scripts/test.sh                        lint, types, layers, then the whole suite
#   scripts/test.sh PYTEST_ARGS            lint, types, layers, then pytest with those arguments
#   scripts/test.sh --quick [PYTEST_ARGS]  the unit tests and the integration tests not marked slow,
#                                          on every core (pytest-xdist): for iterating
set -euo pipefail
cd "$(dirname "$0")/.."
quick=0
if [[ ${1:-} == --quick ]]; then
    quick=1
    shift
fi
# Bytecode is compiled when a module is first imported, not for each of the ~25,000 files the
# engine and the tools install (~60 s of a fresh set-up here; the tests import a tenth), and
# written then: with PYTHONDONTWRITEBYTECODE set (as some CI images set it), every process
# would compile its imports again (measured: each real vLLM start 15-35 s slower).
PIP_INSTALL_OPTIONS=--no-compile bash scripts/setup.sh --engine --tests
unset PYTHONDONTWRITEBYTECODE
# As after `. .venv/bin/activate`: local topologies run `python3`, `vllm` and `mooncake_master`
# from PATH, as a user's shell would.
export PATH="$PWD/.venv/bin:$PATH"
if ((quick)); then
    exec python -m pytest -n auto -m "not slow" --durations=10 tests/unit tests/integration "$@"
fi
ruff check .
ruff format --check ucmctl connector csrc  # the product code as the formatter writes it
lint-imports        # the layers import one way (pyproject's [tool.importlinter])
if (($#)); then
    mypy            # the product packages (pyproject's [tool.mypy])
    exec python -m pytest --durations=30 "$@"
fi
# Two lanes side by side, each line of their output prefixed with the lane's name:
# - hosts: the tests of test hosts (network namespaces with sshd, GlusterFS, podman, docker,
#   systemd, the real vLLM over SSH), integration then end-to-end, one module at a time: they
#   drive daemons of this machine and time faults to the second;
# - local: the tests on this machine alone, and mypy. The unit tests on both cores, then the
#   real-vLLM tests on loopback (they keep the cores busy) while the hosts lane runs its
#   integration tests (measured: a quarter of the two cores busy: they wait on simulators, SSH
#   and faults), then the integration tests of simulated engines on two workers, each module
#   whole on one, then those of a private Slurm cluster of simulated engines (SLURM_SIM), one
#   module at a time, beside the hosts lane's real-vLLM tests.
# Three lanes were tried: real-vLLM tests of three lanes at once outgrow the machine's memory
# (an engine killed by the kernel's OOM killer). A real-vLLM test of test hosts moved to the end
# of the local lane ran beside the hosts lane's (four servers at once): no faster, and a `down`
# there timed out stopping a server. Both lanes run to their end; the suite fails
# if either failed.
SLURM_SIM=(tests/integration/support/test_slurm_cluster.py tests/integration/launch/test_slurm_deploy.py
           tests/integration/launch/test_sbatch_real.py tests/integration/launch/test_slurm_gres.py)
# The network filesystem's faults run last in the hosts lane, and only while no real-vLLM test
# runs in either lane (the QUIET lock): their store waits are bounded at seconds, which a
# GlusterFS volume of these hosts missed while real-vLLM tests kept both cores busy (seen:
# healthy runs with save timeouts).
NETFS=(tests/integration/deploy/test_storage_faults.py tests/integration/store/test_store_netfs.py)
hosts_lane() {
    local rc=0
    python -m pytest --durations=30 -m root "${SLURM_SIM[@]/#/--ignore=}" "${NETFS[@]/#/--ignore=}" \
        tests/integration tests/e2e || rc=1
    python -m pytest --durations=10 -m root "${NETFS[@]}" || rc=1
    return $rc
}
local_lane() {
    local rc=0
    python -m pytest -n auto --durations=15 tests/unit || rc=1
    python -m pytest --durations=15 -m "not root" tests/e2e || rc=1
    mypy || rc=1    # the product packages (pyproject's [tool.mypy])
    python -m pytest -n 2 --dist loadfile --durations=15 -m "not root" tests/integration || rc=1
    python -m pytest --durations=15 "${SLURM_SIM[@]}" || rc=1
    return $rc
}
LANES=(hosts local)
lanes=$(mktemp -d)
trap 'rm -rf "$lanes"' EXIT
for lane in "${LANES[@]}"; do
    { rc=0; "${lane}_lane" 2>&1 || rc=$?; echo $rc >"$lanes/$lane"; } | sed -u "s/^/[$lane] /" &
done
wait
failed=0
for lane in "${LANES[@]}"; do
    rc=$(cat "$lanes/$lane" 2>/dev/null || echo 1)
    echo "test.sh: the $lane lane $( ((rc == 0)) && echo passed || echo "failed (exit $rc)")"
    ((rc == 0)) || failed=1
done
exit $failed
