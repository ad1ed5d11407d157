#!/usr/bin/env bash
# The main job on the embedded default topology (topologies/local-1p1d.yaml), set-up included.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/ucmctl validate topologies/local-1p1d.yaml
.venv/bin/ucmctl plan topologies/local-1p1d.yaml
