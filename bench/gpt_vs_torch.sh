#!/usr/bin/env bash
# gpt_vs_torch: gpt_replica's first STEPS losses (default 50) against PyTorch's on the same
# model, the same initial weights (read from gpt_replica's checkpoint of global step 0 by
# bench/peers/torch_gpt.py), the same batches and the same optimizer (AdamW, the warmup of a
# 2000-step schedule, clipping), both in float32 on one thread; then the training speed of the
# two (and of TensorFlow, with TF_PYTHON set), tokens per second over STEPS_SPEED steps (default
# 200) of the default configuration, on one thread and on two.
# JSON lines: the largest relative difference of the losses, and the speeds (training, and
# sampling with the key/value cache) with their ratios.
# Needs Debian's python3-torch (the peers' README).
#   TF_PYTHON=VENV/bin/python JAX_PYTHON=VENV2/bin/python bench/gpt_vs_torch.sh
set -euo pipefail
cd "$(dirname "$0")/.."
STEPS=${STEPS:-50}
STEPS_SPEED=${STEPS_SPEED:-200}
BIN=${DG_BIN_DIR:-build/bin}
source bench/lib.bash
cpu=$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -1)
read -r P0 P1 <<< "$(ports 2)"
"$BIN/gpt_replica" --worker_hosts "127.0.0.1:$P0" --job_name worker --task_index 0 --train_steps "$STEPS" \
    --lr_end_step 2000 --log_every 1 --quiet --eval_windows 12 --checkpoint_path "$TMP/ckpt.db" > "$TMP/dg" 2>&1 ||
    { cat "$TMP/dg" >&2; exit 1; }
sed -n 's/.*training step \([0-9]*\) done.*, loss \(.*\)$/\1 \2/p' "$TMP/dg" > "$TMP/dg.losses"
/usr/bin/python3 bench/peers/torch_gpt.py --checkpoint "$TMP/ckpt.db" --steps "$STEPS" --threads 1 > "$TMP/torch"
sed -n 's/^step \([0-9]*\) loss \(.*\)$/\1 \2/p' "$TMP/torch" > "$TMP/torch.losses"
# Both lists must hold STEPS numbers; NaN or a missing line fails (awk compares strings otherwise).
python3 - "$TMP/dg.losses" "$TMP/torch.losses" "$STEPS" "$cpu" <<'EOF'
import json, math, sys
a = [float(l.split()[1]) for l in open(sys.argv[1])]
b = [float(l.split()[1]) for l in open(sys.argv[2])]
n = int(sys.argv[3])
if len(a) != n or len(b) != n or not all(math.isfinite(x) for x in a + b):
    sys.exit("gpt_vs_torch: expected %d finite losses each, got %d and %d" % (n, len(a), len(b)))
rel = [abs(x - y) / abs(y) for x, y in zip(a, b)]
worst = max(range(n), key=lambda i: rel[i])
print(json.dumps({"bench": "gpt_vs_torch", "metric": "loss_match", "steps": n, "max_rel_diff": rel[worst],
                  "at_step": worst + 1, "distgraph": a[worst], "torch": b[worst], "first": [a[0], b[0]],
                  "last": [a[-1], b[-1]], "bar": 1e-4, "ok": rel[worst] <= 1e-4, "cpu": sys.argv[4]}))
EOF
# Speed: one process each, THREADS threads each (default "1 2": DG_INTRA_OP_THREADS, torch
# --threads, TensorFlow's intra_op_parallelism_threads), tokens per second of the training loop;
# TensorFlow (bench/peers/tf_gpt.py, tf.compat.v1 graph mode) when TF_PYTHON names a Python
# with tensorflow (the peers' README), JAX's jit (bench/peers/jax_gpt.py) when JAX_PYTHON names
# one with jax (a venv: pip install "jax[cpu]").
for th in ${THREADS:-1 2}; do
    DG_INTRA_OP_THREADS=$th "$BIN/gpt_replica" --worker_hosts "127.0.0.1:$P1" --job_name worker --task_index 0 \
        --train_steps "$STEPS_SPEED" --log_every 1000000 --quiet --eval_windows 12 > "$TMP/dg_speed" 2>&1 ||
        { cat "$TMP/dg_speed" >&2; exit 1; }
    # The steps over the loop's seconds (the printed rate has one decimal).
    dg_steps=$(sed -n 's/^Training elapsed time: \([0-9.]*\) s (\([0-9]*\) local steps,.*/\2 \1/p' "$TMP/dg_speed" |
        awk '{ printf "%.4f", $1 / $2 }')
    torch_json=$(/usr/bin/python3 bench/peers/torch_gpt.py --step-bench --steps "$STEPS_SPEED" --threads "$th")
    tf_json='{}' jax_json='{}'
    if [ -n "${TF_PYTHON:-}" ]; then
        tf_json=$("$TF_PYTHON" bench/peers/tf_gpt.py --step-bench --steps "$STEPS_SPEED" --threads "$th" | tail -1)
    fi
    if [ -n "${JAX_PYTHON:-}" ]; then
        jax_json=$("$JAX_PYTHON" bench/peers/jax_gpt.py --step-bench --steps "$STEPS_SPEED" --threads "$th" | tail -1)
    fi
    python3 - "$dg_steps" "$torch_json" "$tf_json" "$th" "$cpu" "$(sed -n 's/^distgraph: cpu: //p' "$TMP/dg_speed")" \
        "$jax_json" <<'EOF'
import json, sys
steps_per_s = float(sys.argv[1])
t, f, j = json.loads(sys.argv[2]), json.loads(sys.argv[3]), json.loads(sys.argv[7])
dg = steps_per_s * 12 * 64
line = {"bench": "gpt_vs_torch", "metric": "train_tokens_per_s", "threads": int(sys.argv[4]), "batch": 12,
        "block": 64, "distgraph": round(dg), "torch": round(t["tokens_per_s"]), "ratio": dg / t["tokens_per_s"],
        "torch_version": t["torch"]}
if "tokens_per_s" in f:
    line.update({"tensorflow": round(f["tokens_per_s"]), "ratio_tf": dg / f["tokens_per_s"],
                 "tf_version": f["tensorflow"]})
if "tokens_per_s" in j:
    line.update({"jax_jit": round(j["tokens_per_s"]), "ratio_jax": dg / j["tokens_per_s"], "jax_version": j["jax"]})
line.update({"cpu": sys.argv[5], "kernels": sys.argv[6]})
print(json.dumps(line))
EOF
done
# Sampling with the key/value cache: SAMPLE new bytes (default 500) greedily from the first
# run's checkpoint (step 50), one thread each, decoder steps per second (both restart
# a full context from its last half, so both take the same steps).
SAMPLE=${SAMPLE:-500}
dg_sample=$(DG_INTRA_OP_THREADS=1 "$BIN/gpt_sample" --checkpoint "$TMP/ckpt.db" --tokens "$SAMPLE" --temperature 0 2>&1 >/dev/null |
    sed -n 's/.* \([0-9]*\) decoder steps in .* (\([0-9.]*\) steps\/s)$/\1 \2/p')
torch_sample=$(/usr/bin/python3 bench/peers/torch_gpt.py --checkpoint "$TMP/ckpt.db" --sample-bench "$SAMPLE" --threads 1)
python3 - "$dg_sample" "$torch_sample" "$cpu" <<'PY'
import json, sys
steps, rate = sys.argv[1].split()
t = json.loads(sys.argv[2])
if int(steps) != t["decoder_steps"]:
    sys.exit("gpt_vs_torch: %s decoder steps against torch's %d" % (steps, t["decoder_steps"]))
print(json.dumps({"bench": "gpt_vs_torch", "metric": "sample_steps_per_s", "threads": 1, "new_bytes": t["new_bytes"],
                  "decoder_steps": int(steps), "distgraph": round(float(rate), 1), "torch": round(t["steps_per_s"], 1),
                  "ratio": float(rate) / t["steps_per_s"], "cpu": sys.argv[3]}))
PY
