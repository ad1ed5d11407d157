#!/usr/bin/env bash
# Set up everything the tests need on a fresh machine, then run the whole suite.
#   scripts/test.sh [pytest args]
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --engine
.venv/bin/ruff check .
exec .venv/bin/python -m pytest "$@"
