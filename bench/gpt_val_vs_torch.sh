#!/usr/bin/env bash
# gpt_val_vs_torch: the validation loss after STEPS training steps (default 2000) of gpt_replica's
# default configuration against PyTorch's (bench/peers/torch_gpt.py: the same architecture, the
# same text and batch stream, the same AdamW, schedule and clipping, its own initial weights
# drawn from the same distributions), for each seed of SEEDS (default "1 2 3"). The two run side
# by side, one thread each. Both evaluate the same EVAL windows (default 200) of the last 10% of
# the text (gpt_validation_loss). JSON lines: one per seed, then the means, their difference and
# the bar (0.03).
# Needs Debian's python3-torch (the peers' README). About 6 minutes a seed on two cores.
#   bench/gpt_val_vs_torch.sh
set -euo pipefail
cd "$(dirname "$0")/.."
STEPS=${STEPS:-2000}
SEEDS=${SEEDS:-1 2 3}
EVAL=${EVAL:-200}
BIN=${DG_BIN_DIR:-build/bin}
source bench/lib.bash
cpu=$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -1)
for seed in $SEEDS; do
    read -r P0 <<< "$(ports 1)"
    DG_INTRA_OP_THREADS=1 "$BIN/gpt_replica" --worker_hosts "127.0.0.1:$P0" --job_name worker --task_index 0 \
        --train_steps "$STEPS" --seed "$seed" --eval_windows "$EVAL" --log_every 500 > "$TMP/dg$seed" 2>&1 &
    dg=$!
    PIDS+=("$dg")
    /usr/bin/python3 bench/peers/torch_gpt.py --seed "$seed" --steps "$STEPS" --decay_steps $((STEPS - 100)) \
        --eval_windows "$EVAL" --threads 1 | tail -1 > "$TMP/torch$seed"
    wait "$dg" || { cat "$TMP/dg$seed" >&2; exit 1; }
    dgv=$(sed -n 's/^After .* validation loss = \([0-9.]*\) .*/\1/p' "$TMP/dg$seed")
    python3 - "$seed" "$dgv" "$(cat "$TMP/torch$seed")" "$STEPS" <<'EOF'
import json, math, sys
seed, dg, t, steps = int(sys.argv[1]), float(sys.argv[2] or "nan"), json.loads(sys.argv[3]), int(sys.argv[4])
tv = t.get("val_loss", float("nan"))
if not (math.isfinite(dg) and math.isfinite(tv)):
    sys.exit("gpt_val_vs_torch: seed %d: validation losses %r and %r" % (seed, dg, tv))
print(json.dumps({"bench": "gpt_val_vs_torch", "metric": "val_loss", "seed": seed, "steps": steps,
                  "distgraph": dg, "torch": tv, "diff": dg - tv}))
EOF
done | tee "$TMP/lines"
python3 - "$TMP/lines" "$cpu" <<'EOF'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
a = sum(r["distgraph"] for r in rows) / len(rows)
b = sum(r["torch"] for r in rows) / len(rows)
print(json.dumps({"bench": "gpt_val_vs_torch", "metric": "val_loss_mean", "seeds": [r["seed"] for r in rows],
                  "steps": rows[0]["steps"], "distgraph": round(a, 5), "torch": round(b, 5),
                  "abs_diff": round(abs(a - b), 5), "bar": 0.03, "ok": abs(a - b) <= 0.03, "cpu": sys.argv[2]}))
EOF
