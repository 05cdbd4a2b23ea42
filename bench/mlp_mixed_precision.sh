#!/usr/bin/env bash
# mlp_mixed_precision: the training step of a 1024-wide MLP (784-1024-1024-10, ReLU, Adam,
# batch 256 of Fashion-MNIST, one thread) in float32 and with its products in bfloat16:
#   distgraph_float32         build/bin/step_bench --model wide
#   distgraph_bf16_build      --mixed_precision bf16 (dg_graph_set_mixed_precision: MatMul alone)
#   distgraph_bf16_rewrite    --mixed_precision bf16 --amp rewrite (the session's rewrite)
#   torch_float32, torch_autocast_bf16     bench/peers/wide_mlp.py --framework torch
#   tf_float32, tf_onednn_bf16             ... --framework tf, when TF_PYTHON names a python
#                                          with tensorflow-cpu (grappler's oneDNN bf16 rewrite)
# in rounds, each running every configuration once back to back; each round's medians (ms) and
# ratios, then the ratios of the medians over the rounds, as JSON lines. ROUNDS (default 3),
# STEPS timed steps each (default 200).
#   TF_PYTHON=VENV/bin/python bench/mlp_mixed_precision.sh
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${ROUNDS:-3}
STEPS=${STEPS:-200}
BIN=${DG_BIN_DIR:-build/bin}
ours() { "$BIN/step_bench" --model wide --batch_size 256 --steps "$STEPS" --warmup 20 "$@" 2>/dev/null |
         sed -n 's/.*"median_step", "value": \([0-9.]*\).*/\1/p'; }
peer() { "$@" --steps "$STEPS" --warmup 20 --threads 1 2>/dev/null | sed -n 's/^median_ms=\([0-9.]*\)$/\1/p'; }
names=(distgraph_float32 distgraph_bf16_build distgraph_bf16_rewrite torch_float32 torch_autocast_bf16)
[ -n "${TF_PYTHON:-}" ] && names+=(tf_float32 tf_onednn_bf16)
"$BIN/dg-inspect" cpu 2>/dev/null | sed 's/"/\\"/g; s/.*/{"bench": "mlp_mixed_precision", "metric": "setup", "cpu": "&"}/'
# report KIND ROUND NAME=MS... : one JSON line of medians (of each name's values) and ratios.
report() {
    python3 - "$@" <<'EOF'
import json, statistics, sys
kind, r, pairs = sys.argv[1], sys.argv[2], sys.argv[3:]
ms = {}
for p in pairs:
    k, v = p.split("=", 1)
    ms[k] = statistics.median(float(x) for x in v.split())
line = {"bench": "mlp_mixed_precision", "metric": kind, "unit": "ms per step (median)"}
if kind == "round":
    line["round"] = int(r)
line.update(ms)
own = ms["distgraph_bf16_rewrite"]
line["bf16_rewrite_vs_own_float32"] = round(ms["distgraph_float32"] / own, 3)
line["bf16_build_vs_own_float32"] = round(ms["distgraph_float32"] / ms["distgraph_bf16_build"], 3)
line["bf16_rewrite_vs_torch_autocast"] = round(ms["torch_autocast_bf16"] / own, 3)
if "tf_onednn_bf16" in ms:
    line["bf16_rewrite_vs_tf_onednn_bf16"] = round(ms["tf_onednn_bf16"] / own, 3)
    line["bf16_rewrite_vs_faster_peer_bf16"] = round(min(ms["torch_autocast_bf16"], ms["tf_onednn_bf16"]) / own, 3)
print(json.dumps(line))
EOF
}
declare -A runs
for r in $(seq "$ROUNDS"); do
    declare -A t=()
    t[distgraph_float32]=$(ours)
    t[distgraph_bf16_build]=$(ours --mixed_precision bf16)
    t[distgraph_bf16_rewrite]=$(ours --mixed_precision bf16 --amp rewrite)
    t[torch_float32]=$(peer /usr/bin/python3 bench/peers/wide_mlp.py --framework torch)
    t[torch_autocast_bf16]=$(peer /usr/bin/python3 bench/peers/wide_mlp.py --framework torch --autocast bf16)
    if [ -n "${TF_PYTHON:-}" ]; then
        t[tf_float32]=$(peer "$TF_PYTHON" bench/peers/wide_mlp.py --framework tf)
        t[tf_onednn_bf16]=$(peer "$TF_PYTHON" bench/peers/wide_mlp.py --framework tf --bf16)
    fi
    args=()
    for n in "${names[@]}"; do
        [ -n "${t[$n]}" ] || { echo "mlp_mixed_precision: $n printed no median" >&2; exit 1; }
        runs[$n]="${runs[$n]:-} ${t[$n]}"
        args+=("$n=${t[$n]}")
    done
    report round "$r" "${args[@]}"
done
args=()
for n in "${names[@]}"; do args+=("$n=${runs[$n]}"); done
report median_over_rounds 0 "${args[@]}"
