#!/usr/bin/env bash
# gpt_mixed_precision: gpt_replica's training speed with its products in bfloat16
# (--mixed_precision bf16, built so; and --amp rewrite, the session's rewrite) against its own
# float32, against PyTorch's CPU autocast to bfloat16
# (bench/peers/torch_gpt.py --autocast bf16) and, with TF_PYTHON set, TensorFlow's oneDNN
# bfloat16 rewrite (bench/peers/tf_gpt.py --bf16), each also in float32; tokens per second
# over STEPS_SPEED steps (default 200), one thread, ROUNDS rounds (default 3) back to back.
# Then, unless VAL=0, the validation loss after STEPS steps (default 2000) in each of MODES
# (default "off bf16 fp16": float32, bfloat16 products, float16 products with dynamic loss
# scaling; seed 1). ROUNDS=0 gives the losses alone. JSON lines; the kernels that ran in the first.
#   TF_PYTHON=VENV/bin/python bench/gpt_mixed_precision.sh
set -euo pipefail
cd "$(dirname "$0")/.."
STEPS=${STEPS:-2000}
STEPS_SPEED=${STEPS_SPEED:-200}
ROUNDS=${ROUNDS:-3}
BIN=${DG_BIN_DIR:-build/bin}
source bench/lib.bash
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
cpu=$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -1)

# Tokens per second of gpt_replica's training loop (the steps over the loop's seconds).
dg_speed() {   # dg_speed MODE [AMP]: AMP build (default) or rewrite (gpt_replica --amp)
    read -r P0 <<< "$(ports 1)"
    DG_INTRA_OP_THREADS=1 "$BIN/gpt_replica" --worker_hosts "127.0.0.1:$P0" --job_name worker --task_index 0 \
        --train_steps "$STEPS_SPEED" --log_every 1000000 --quiet --eval_windows 12 --mixed_precision "$1" \
        --amp "${2:-build}" \
        > "$TMP/dg" 2>&1 || { cat "$TMP/dg" >&2; exit 1; }
    sed -n 's/^Training elapsed time: \([0-9.]*\) s (\([0-9]*\) local steps,.*/\2 \1/p' "$TMP/dg" |
        awk '{ printf "%.1f", $1 / $2 * 12 * 64 }'
}
field() { python3 -c 'import json, sys; print(round(json.loads(sys.argv[1]).get("tokens_per_s", 0), 1))' "$1"; }

echo "{\"bench\": \"gpt_mixed_precision\", \"metric\": \"setup\", \"cpu\": \"$cpu\", \"kernels\": \"$("$BIN/dg-inspect" cpu)\"}"
for r in $(seq "$ROUNDS"); do
    f32=$(dg_speed off)
    bf=$(dg_speed bf16)
    bfr=$(dg_speed bf16 rewrite)
    tf32=$(field "$(/usr/bin/python3 bench/peers/torch_gpt.py --step-bench --steps "$STEPS_SPEED" --threads 1 | tail -1)")
    tbf=$(field "$(/usr/bin/python3 bench/peers/torch_gpt.py --step-bench --steps "$STEPS_SPEED" --threads 1 --autocast bf16 | tail -1)")
    ff32=0 fbf=0
    if [ -n "${TF_PYTHON:-}" ]; then
        ff32=$(field "$("$TF_PYTHON" bench/peers/tf_gpt.py --step-bench --steps "$STEPS_SPEED" --threads 1 | tail -1)")
        fbf=$(field "$("$TF_PYTHON" bench/peers/tf_gpt.py --step-bench --steps "$STEPS_SPEED" --threads 1 --bf16 | tail -1)")
    fi
    python3 - "$r" "$f32" "$bf" "$tf32" "$tbf" "$ff32" "$fbf" "$bfr" <<'EOF'
import json, sys
r, f32, bf, t32, tbf, ff32, fbf, bfr = sys.argv[1], *map(float, sys.argv[2:])
line = {"bench": "gpt_mixed_precision", "metric": "train_tokens_per_s", "round": int(r), "threads": 1,
        "distgraph_float32": f32, "distgraph_bf16": bf, "bf16_vs_float32": round(bf / f32, 3),
        "distgraph_bf16_rewrite": bfr, "bf16_rewrite_vs_float32": round(bfr / f32, 3),
        "torch_float32": t32, "torch_autocast_bf16": tbf, "vs_torch_bf16": round(bf / tbf, 3),
        "rewrite_vs_torch_bf16": round(bfr / tbf, 3)}
if fbf > 0:
    line.update({"tf_float32": ff32, "tf_onednn_bf16": fbf, "vs_tf_bf16": round(bf / fbf, 3),
                 "vs_faster_peer_bf16": round(bf / max(tbf, fbf), 3),
                 "rewrite_vs_faster_peer_bf16": round(bfr / max(tbf, fbf), 3)})
print(json.dumps(line))
EOF
done

[ "${VAL:-1}" = 0 ] && exit 0
# The validation losses, each mode from the same seed; fp16 products train with dynamic loss
# scaling (the steps it skipped are counted). A mode ending in _rewrite (bf16_rewrite,
# fp16_rewrite) applies it by the session's rewrite (--amp rewrite).
MODES=${MODES:-off bf16 fp16 bf16_rewrite fp16_rewrite}
for mode in $MODES; do
    read -r P0 <<< "$(ports 1)"
    amp=build
    case "$mode" in *_rewrite) amp=rewrite ;; esac
    DG_INTRA_OP_THREADS=1 "$BIN/gpt_replica" --worker_hosts "127.0.0.1:$P0" --job_name worker --task_index 0 \
        --train_steps "$STEPS" --seed 1 --eval_windows 200 --log_every 1000000 --quiet \
        --mixed_precision "${mode%_rewrite}" --amp "$amp" > "$TMP/val_$mode" 2>&1 || { cat "$TMP/val_$mode" >&2; exit 1; }
done
python3 - "$TMP" "$STEPS" $MODES <<'EOF'
import json, re, sys
tmp, steps, modes = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
line = {"bench": "gpt_mixed_precision", "metric": "validation_loss", "steps": steps, "seed": 1}
for m in modes:
    text = open(f"{tmp}/val_{m}").read()
    v = re.search(r"^After .* validation loss = ([0-9.]+)", text, re.M)
    if not v:
        sys.exit(f"gpt_mixed_precision: no validation loss from --mixed_precision {m}")
    line["float32" if m == "off" else m] = float(v.group(1))
    s = re.search(r"^Loss scaling: scale (\S+), (\d+) steps skipped", text, re.M)
    if s:
        line[f"{m}_loss_scale"], line[f"{m}_skipped_steps"] = float(s.group(1)), int(s.group(2))
if "float32" in line:
    for m in modes:
        if m != "off":
            line[f"{m}_relative_difference"] = round((line[m] - line["float32"]) / line["float32"], 5)
print(json.dumps(line))
EOF
