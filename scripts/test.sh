#!/usr/bin/env bash
# Set up everything the tests need on a fresh machine, then run the whole suite.
#   scripts/test.sh [pytest args]
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --engine
# As after `. .venv/bin/activate`: local topologies run `python3`, `vllm` and `mooncake_master`
# from PATH, as a user's shell would.
export PATH="$PWD/.venv/bin:$PATH"
ruff check .
mypy                # the product packages (pyproject's [tool.mypy])
lint-imports        # the layers import one way (pyproject's [tool.importlinter])
exec python -m pytest --durations=30 "$@"  # the slowest, to keep CI well under 45 minutes
