#!/usr/bin/env bash
# Runs step_bench and the PyTorch peer (../shared/peers/torch_mlp.py, or bench/peers/) back to
# back, REPS times each, and prints both medians and the ratio as JSON lines.
# Needs: build/bin/step_bench, Debian's python3-torch (apt-get install python3-torch python3-numpy).
set -euo pipefail
cd "$(dirname "$0")/.."
REPS=${REPS:-3}
peer=${PEER_DIR:-../shared/peers}/torch_mlp.py
[ -f "$peer" ] || { echo "peer script $peer not found (set PEER_DIR)"; exit 2; }
ours=()
theirs=()
for i in $(seq "$REPS"); do
    ours+=("$(build/bin/step_bench | sed -n 's/.*"median_step", "value": \([0-9.]*\).*/\1/p')")
    theirs+=("$(/usr/bin/python3 "$peer" --step-bench --threads 1 | sed -n 's/.*median_ms=\([0-9.]*\).*/\1/p')")
done
median() { printf '%s\n' "$@" | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
o=$(median "${ours[@]}")
t=$(median "${theirs[@]}")
echo "{\"bench\": \"step_bench\", \"metric\": \"median_step_distgraph\", \"value\": $o, \"unit\": \"ms\", \"runs\": \"${ours[*]}\"}"
echo "{\"bench\": \"step_bench\", \"metric\": \"median_step_torch\", \"value\": $t, \"unit\": \"ms\", \"runs\": \"${theirs[*]}\"}"
awk -v o="$o" -v t="$t" 'BEGIN { printf "{\"bench\": \"step_bench\", \"metric\": \"speedup_vs_torch\", \"value\": %.2f, \"unit\": \"x\"}\n", t / o }'
