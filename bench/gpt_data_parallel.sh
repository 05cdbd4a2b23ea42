#!/usr/bin/env bash
# gpt_data_parallel: gpt_replica's validation loss after the same number of examples seen, one
# process against data parallel training on 127.0.0.1 (dg-launch):
#   single     one process, STEPS steps (default 2000) of batch 12
#   all_reduce 2 workers, STEPS / 2 synchronous steps of batch 12 each (a global batch of 24):
#              the learning rate, its floor and the warmup scaled for the doubled batch
#              (AR_LR, default 0.002, AR_MIN_LR 0.0002, AR_WARMUP 50: the linear scaling rule
#              with the warmup over the same examples)
#   async_ps   1 ps + 2 workers, STEPS global steps in all (each worker's update one global
#              step), the single process's hyperparameters but the learning rate and its floor,
#              scaled by sqrt 2 (PS_LR, default 0.0014, PS_MIN_LR 0.00014). Measured on seed 1
#              (2026-11-29): 0.0007 ended 0.136 above the single process, 0.001 0.065 above,
#              0.0014 0.016 above; 1 ps + 1 worker at 0.001 equals the single process exactly.
# One thread a task. JSON lines: each mode's validation loss (--eval_windows EVAL, default 200)
# and its difference from the single process's, with the bar (0.05).
#   bench/gpt_data_parallel.sh            (about 15 minutes on two cores)
set -euo pipefail
cd "$(dirname "$0")/.."
STEPS=${STEPS:-2000}
EVAL=${EVAL:-200}
SEED=${SEED:-1}
MODES=${MODES:-single all_reduce async_ps}
BIN=${DG_BIN_DIR:-build/bin}
source bench/lib.bash
cpu=$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -1)
export DG_INTRA_OP_THREADS=1
common=(--seed "$SEED" --eval_windows "$EVAL" --log_every 250)
val_of() { sed -n "s/^$1After [0-9]* training step(s), validation loss = \([0-9.]*\) .*/\1/p" "$2" | head -1; }
single=${SINGLE_VAL:-}
for mode in $MODES; do
    t0=$(date +%s.%N)
    case $mode in
    single)
        read -r P0 <<< "$(ports 1)"
        "$BIN/gpt_replica" --worker_hosts "127.0.0.1:$P0" --job_name worker --task_index 0 --train_steps "$STEPS" \
            "${common[@]}" > "$TMP/single" 2>&1 || { cat "$TMP/single" >&2; exit 1; }
        v=$(val_of "" "$TMP/single")
        single=$v
        extra='"steps": '$STEPS', "batch": 12' ;;
    all_reduce)
        "$BIN/dg-launch" --ps 0 --workers 2 --timeout 3600 -- "$BIN/gpt_replica" --all_reduce \
            --train_steps $((STEPS / 2)) --learning_rate "${AR_LR:-0.002}" --min_lr "${AR_MIN_LR:-0.0002}" \
            --warmup_steps "${AR_WARMUP:-50}" "${common[@]}" > "$TMP/ar" 2>&1 || { cat "$TMP/ar" >&2; exit 1; }
        v=$(val_of '\[worker0\] ' "$TMP/ar")
        extra='"steps": '$((STEPS / 2))', "workers": 2, "global_batch": 24, "learning_rate": '${AR_LR:-0.002} ;;
    async_ps)
        "$BIN/dg-launch" --ps 1 --workers 2 --timeout 3600 -- "$BIN/gpt_replica" --train_steps "$STEPS" \
            --learning_rate "${PS_LR:-0.0014}" --min_lr "${PS_MIN_LR:-0.00014}" "${common[@]}" > "$TMP/ps" 2>&1 ||
            { cat "$TMP/ps" >&2; exit 1; }
        v=$(val_of '\[worker0\] ' "$TMP/ps")
        extra='"global_steps": '$STEPS', "ps": 1, "workers": 2, "batch": 12, "learning_rate": '${PS_LR:-0.0014} ;;
    *) echo "gpt_data_parallel: unknown mode $mode" >&2; exit 2 ;;
    esac
    secs=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
    [ -n "$v" ] || { echo "gpt_data_parallel: $mode printed no validation loss" >&2; exit 1; }
    python3 - "$mode" "$v" "${single:-nan}" "$secs" "$cpu" "{$extra}" <<'EOF'
import json, math, sys
mode, v, single, secs, cpu, extra = sys.argv[1], float(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4]), sys.argv[5], json.loads(sys.argv[6])
line = {"bench": "gpt_data_parallel", "mode": mode, "val_loss": v, "examples": None, "seconds": round(secs, 1)}
line.update(extra)
line["examples"] = 12 * (extra.get("steps", 0) * extra.get("workers", 1) if mode != "async_ps" else extra["global_steps"])
if mode != "single" and math.isfinite(single):
    line.update({"single": single, "diff": v - single, "bar": 0.05, "ok": abs(v - single) <= 0.05})
line["cpu"] = cpu
print(json.dumps(line))
EOF
done
