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
bash scripts/setup.sh --engine --tests
# As after `. .venv/bin/activate`: local topologies run `python3`, `vllm` and `mooncake_master`
# from PATH, as a user's shell would.
export PATH="$PWD/.venv/bin:$PATH"
if ((quick)); then
    exec python -m pytest -n auto -m "not slow" --durations=10 tests/unit tests/integration "$@"
fi
ruff check .
ruff format --check ucmctl connector csrc  # the product code as the formatter writes it
mypy                # the product packages (pyproject's [tool.mypy])
lint-imports        # the layers import one way (pyproject's [tool.importlinter])
if (($#)); then
    exec python -m pytest --durations=30 "$@"
fi
# The unit tests on every core (pytest-xdist). The integration tests that run on this machine
# alone (simulated engines on loopback) on three workers, each module whole on one: they wait on
# the simulators' timings far more than they compute (measured: a quarter of the two cores busy).
# Then, one at a time, those of test hosts (network namespaces, GlusterFS, Slurm, containers: one
# daemon of this machine each, and faults timed to the second) and those of the real vLLM (they
# keep the cores busy, and a second run beside them would skew their timings).
python -m pytest -n auto --durations=15 tests/unit
python -m pytest -n 3 --dist loadfile --durations=15 -m "not root" tests/integration
python -m pytest --durations=30 -m root tests/integration
exec python -m pytest --durations=30 tests/e2e
