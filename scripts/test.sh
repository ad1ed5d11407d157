#!/usr/bin/env bash
# Set up everything the tests need on a fresh machine (scripts/setup.sh --engine --tests: the real
# vLLM for the CPU, the test infrastructure, the development tools), then run the tests.
#   scripts/test.sh [pytest args]          lint, types, layers, then the whole suite
#   scripts/test.sh --quick [pytest args]  the unit tests and the integration tests not marked slow
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
    exec python -m pytest -m "not slow" --durations=10 tests/unit tests/integration "$@"
fi
ruff check .
mypy                # the product packages (pyproject's [tool.mypy])
lint-imports        # the layers import one way (pyproject's [tool.importlinter])
exec python -m pytest --durations=30 "$@"  # the slowest, to keep CI well under 45 minutes
