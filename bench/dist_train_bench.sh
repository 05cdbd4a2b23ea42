#!/usr/bin/env bash
# dist_train_bench: global steps/s of asynchronous parameter-server training of the
# MNIST-replica model (batch 100) with 1 ps and 1 or 2 workers, through dg-launch and
# mnist_replica; then the PyTorch peer (../shared/peers/torch_ps.py, torch.distributed.rpc)
# with 2 workers, back to back on the same machine. JSON lines.
# Needs build/bin (scripts/build.sh) and, for the peer, Debian's python3-torch.
set -euo pipefail
cd "$(dirname "$0")/.."
STEPS=${STEPS:-3000}
PEER=${PEER_DIR:-../shared/peers}/torch_ps.py
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
ours2=""
for workers in 1 2; do
    build/bin/dg-launch --ps 1 --workers "$workers" --timeout 600 -- build/bin/mnist_replica \
        --train_steps "$STEPS" --quiet --log_every 1000000 > "$TMP/out" 2>&1 || { cat "$TMP/out"; exit 1; }
    rate=$(awk -v steps="$STEPS" '
        /Training begins @/ { b = $NF; if (!first || b < first) first = b }
        /Training ends @/ { e = $NF; if (e > last) last = e }
        END { printf "%.1f", steps / (last - first) }' "$TMP/out")
    acc=$(sed -n 's/.*validation accuracy = \([0-9.]*\).*/\1/p' "$TMP/out" | head -1)
    echo "{\"bench\": \"dist_train_bench\", \"metric\": \"global_steps_per_s\", \"value\": $rate, \"unit\": \"steps/s\", \"ps\": 1, \"workers\": $workers, \"test_accuracy\": $acc}"
    [ "$workers" = 2 ] && ours2=$rate
done
if [ -f "$PEER" ] && /usr/bin/python3 -c "import torch" 2>/dev/null; then
    /usr/bin/python3 "$PEER" --workers 2 --steps 2000 --threads 1 --transport uv --max-seconds 300 > "$TMP/peer" 2>&1 || true
    theirs=$(sed -n 's/^RESULT.* global_steps_per_s=\([0-9.]*\).*/\1/p; s/^RESULT.* steps_per_s=\([0-9.]*\).*/\1/p' "$TMP/peer" | head -1)
    if [ -n "$theirs" ]; then
        echo "{\"bench\": \"dist_train_bench\", \"metric\": \"global_steps_per_s_torch_ps\", \"value\": $theirs, \"unit\": \"steps/s\", \"ps\": 1, \"workers\": 2}"
        awk -v o="$ours2" -v t="$theirs" 'BEGIN { printf "{\"bench\": \"dist_train_bench\", \"metric\": \"speedup_vs_torch_ps\", \"value\": %.2f, \"unit\": \"x\"}\n", o / t }'
    else
        echo "dist_train_bench: the peer printed no RESULT line:" >&2
        tail -5 "$TMP/peer" >&2
    fi
else
    echo "dist_train_bench: peer $PEER or python3-torch missing; skipped the comparison" >&2
fi
