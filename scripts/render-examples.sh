#!/usr/bin/env bash
# Everything ucmctl renders for every example topology, into one folder, so that two versions of
# the code can be compared byte for byte (a refactor must leave it unchanged):
#
#   scripts/render-examples.sh OUT    then    diff -r OUT-before OUT-after
#
# Per example: each process's command line, environment, ports, devices, health URLs and files
# (from `ucmctl plan --format json`, without the Plan's own shape), the rendered bundle
# (`plan --out`: ucm_config.yaml, mooncake.json, launch scripts), the Kubernetes manifests
# (`render --k8s`), `up --dry-run`, and the sbatch script of the same topology on a Slurm cluster.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:?usage: scripts/render-examples.sh OUT}
ucmctl=${UCMCTL:-ucmctl}
rm -rf "$out"
mkdir -p "$out"
for topology in topologies/*.yaml; do
    name=$(basename "$topology" .yaml)
    dir="$out/$name"
    mkdir -p "$dir"
    "$ucmctl" plan "$topology" --format json --out "$dir/bundle" 2>/dev/null | python3 -c '
import json, sys
plan = json.load(sys.stdin)
keep = ("name", "role", "node", "stage", "argv", "env", "launch", "files", "ports", "url", "health",
        "health_timeout", "log", "pidfile", "depends_on", "devices", "device_variable", "dp_rank")
print(json.dumps({"deployment": plan["deployment"], "mode": plan["mode"], "engine": plan["engine"],
                  "nodes": plan["nodes"], "store": plan.get("store"),
                  "processes": [{k: p.get(k) for k in keep} for p in plan["processes"]]},
                 indent=1, sort_keys=True))' > "$dir/processes.json"
    rm "$dir/bundle/plan.json"  # the Plan's own shape: compared through processes.json
    "$ucmctl" plan "$topology" > "$dir/plan.txt"
    "$ucmctl" up --dry-run "$topology" > "$dir/up-dry-run.txt"
    "$ucmctl" render "$topology" --k8s "$dir/k8s" > "$dir/render-k8s.txt"
    # The same topology on a Slurm cluster (a copy beside the original: local paths resolve the same).
    slurm="topologies/.render-$name-slurm.yaml"
    { cat "$topology"; printf '\ncluster:\n  kind: slurm\n  partition: batch\n  gres: gpu\n'; } > "$slurm"
    if "$ucmctl" render "$slurm" --slurm "$dir/sbatch" > "$dir/render-slurm.txt" 2>&1; then
        "$ucmctl" up --dry-run "$slurm" > "$dir/up-dry-run-slurm.txt" 2>&1 || true
    fi
    rm -f "$slurm"
done
# The checkout's and the output folder's own paths are not part of what is compared.
abs_out=$(cd "$out" && pwd)
grep -rlF "$abs_out" "$out" | xargs -r sed -i "s|$abs_out|<out>|g"
grep -rlF "$PWD" "$out" | xargs -r sed -i "s|$PWD|<repo>|g"
echo "rendered $(find "$out" -type f | wc -l) files for $(ls "$out" | wc -l) examples under $out"
