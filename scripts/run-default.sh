#!/usr/bin/env bash
# The main job on the embedded default, set-up included: real vLLM on this machine's CPU for
# one prefill and one decode instance (topologies/local-1p1d.yaml), the packaged connector and
# native store, the proxy; the guides' benchmark for the scenarios recompute / hbm / ucm at
# prefix ratio 0.8 (each scenario: ucmctl up, preseed, measure, ucmctl down); the table and
# the plot. Results go to bench-results/default/.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --engine
export PATH="$PWD/.venv/bin:$PATH"
if [[ ! -f .models/medium/config.json ]]; then
    ucmctl model make-tiny .models/medium --size medium
fi
ucmctl validate topologies/local-1p1d.yaml
out=bench-results/default
mkdir -p "$out"
ucmctl bench suite benchmarks/suites/local-default.yaml --fresh --results "$out/cells.jsonl" \
    --save "$out/result.json" --markdown "$out/table.md" --plot "$out/ttft-e2el.png"
echo "table: $out/table.md   plot: $out/ttft-e2el.png   result: $out/result.json"
ucmctl status
