#!/usr/bin/env bash
# The main job on the embedded default, set-up included: real vLLM on this machine's CPU for
# one prefill and one decode instance (topologies/local-1p1d.yaml), the packaged connector and
# native store, the proxy; the guides' benchmark for the scenarios recompute / hbm / ucm at
# prefix ratio 0.8 (each scenario: ucmctl up, preseed, measure, ucmctl down); then the
# multi-turn suite (hbm and ucm, nothing reset: the users' histories outgrow the local KV
# cache); the tables and plots. Results go to bench-results/default/.
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
# The second suite: a multi-turn working set larger than the local KV cache, nothing reset.
ucmctl bench suite benchmarks/suites/local-multiturn.yaml --fresh --results "$out/multiturn-cells.jsonl" \
    --save "$out/multiturn.json" --markdown "$out/multiturn.md" --plot "$out/multiturn.png"
echo "tables: $out/table.md $out/multiturn.md   plots: $out/ttft-e2el.png $out/multiturn.png"
ucmctl status
