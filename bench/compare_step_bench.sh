#!/usr/bin/env bash
# The MLP's training step (batch 100 of Fashion-MNIST, one thread) in distgraph and its peers,
# in rounds: each round runs every configuration once, back to back, so a busy spell of the host
# touches them all alike. Prints each one's median over the rounds, each round's own ratios, and
# the ratios of the medians, as JSON lines.
#   distgraph            step_bench as it comes (oneDNN; products from a mostly-zero A by its
#                        nonzeros, executor/cpu/gemm_sparse.c)
#   distgraph_dense      DG_GEMM_SPARSE=0: the dense GEMM for every product
#   distgraph_openblas   DG_GEMM=openblas DG_GEMM_SPARSE=0: OpenBLAS as the system has it
#   torch                ../shared/peers/torch_mlp.py --step-bench --threads 1 (Debian's python3-torch)
#   tensorflow           ../shared/peers/tf_mlp.py --step-bench --threads 1, when TF_PYTHON names a
#                        python with tensorflow-cpu
# Needs build/bin/step_bench and python3-torch. REPS rounds (default 3).
set -euo pipefail
cd "$(dirname "$0")/.."
REPS=${REPS:-3}
peers=${PEER_DIR:-../shared/peers}
[ -f "$peers/torch_mlp.py" ] || { echo "peer script $peers/torch_mlp.py not found (set PEER_DIR)"; exit 2; }
ours() { env "$@" build/bin/step_bench 2>/dev/null | sed -n 's/.*"median_step", "value": \([0-9.]*\).*/\1/p'; }
peer() { "$@" --step-bench --threads 1 2>/dev/null | sed -n 's/.*median_ms=\([0-9.]*\).*/\1/p'; }
names=(distgraph distgraph_dense distgraph_openblas torch)
[ -n "${TF_PYTHON:-}" ] && names+=(tensorflow)
declare -A runs
build/bin/dg-inspect cpu 2>/dev/null | sed 's/"/\\"/g; s/.*/{"bench": "step_bench", "metric": "setup", "cpu": "&"}/'
for r in $(seq "$REPS"); do
    declare -A t=()
    t[distgraph]=$(ours DG_GEMM_SPARSE=1)
    t[distgraph_dense]=$(ours DG_GEMM_SPARSE=0)
    t[distgraph_openblas]=$(ours DG_GEMM=openblas DG_GEMM_SPARSE=0)
    t[torch]=$(peer /usr/bin/python3 "$peers/torch_mlp.py")
    [ -n "${TF_PYTHON:-}" ] && t[tensorflow]=$(peer "$TF_PYTHON" "$peers/tf_mlp.py")
    line="{\"bench\": \"step_bench\", \"metric\": \"round\", \"round\": $r"
    for n in "${names[@]}"; do
        [ -n "${t[$n]}" ] || { echo "step_bench: $n printed no median" >&2; exit 1; }
        runs[$n]="${runs[$n]:-} ${t[$n]}"
        line+=", \"$n\": ${t[$n]}"
    done
    for p in torch tensorflow; do
        [ -n "${t[$p]:-}" ] && line+=$(awk -v o="${t[distgraph]}" -v p="${t[$p]}" -v n="$p" 'BEGIN { printf ", \"vs_%s\": %.2f", n, p / o }')
    done
    echo "$line}"
done
median() { printf '%s\n' $1 | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
declare -A med
for n in "${names[@]}"; do
    med[$n]=$(median "${runs[$n]}")
    echo "{\"bench\": \"step_bench\", \"metric\": \"median_step_$n\", \"value\": ${med[$n]}, \"unit\": \"ms\", \"runs\": \"${runs[$n]# }\"}"
done
for n in "${names[@]}"; do
    [ "$n" = distgraph ] && continue
    awk -v o="${med[distgraph]}" -v t="${med[$n]}" -v n="$n" \
        'BEGIN { printf "{\"bench\": \"step_bench\", \"metric\": \"speedup_vs_%s\", \"value\": %.2f, \"unit\": \"x\"}\n", n, t / o }'
done
