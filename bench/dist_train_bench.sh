#!/usr/bin/env bash
# dist_train_bench: global steps/s of training the MNIST-replica model (batch 100 per worker,
# Adam) through dg-launch and mnist_replica, then the PyTorch peers, back to back on the same
# machine. JSON lines.
#   async: parameter servers, 1 ps and 1 or 2 workers; peer ../shared/peers/torch_ps.py
#          (torch.distributed.rpc) with 2 workers
#   sync:  2 workers, --sync_replicas (1 ps, the chief applies the averaged gradients) and
#          --all_reduce (no ps, gradients averaged by all-reduce); peer torch_ddp.py (gloo)
# A sync global step uses 2 x 100 examples, as the peer's. MODES=async,sync picks (default
# both). Needs build/bin (scripts/build.sh) and, for the peers, Debian's python3-torch.
set -euo pipefail
cd "$(dirname "$0")/.."
STEPS=${STEPS:-3000}
MODES=${MODES:-async,sync}
PEERS=${PEER_DIR:-../shared/peers}
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT

# run NAME PS WORKERS ARGS...: trains, prints a JSON line, leaves the rate in $rate.
run() {
    local name=$1 ps=$2 workers=$3
    shift 3
    build/bin/dg-launch --ps "$ps" --workers "$workers" --timeout 600 -- build/bin/mnist_replica \
        --train_steps "$STEPS" --quiet --log_every 1000000 "$@" > "$TMP/out" 2>&1 || { cat "$TMP/out"; exit 1; }
    rate=$(awk -v steps="$STEPS" '
        /Training begins @/ { b = $NF; if (!first || b < first) first = b }
        /Training ends @/ { e = $NF; if (e > last) last = e }
        END { printf "%.1f", steps / (last - first) }' "$TMP/out")
    local acc
    acc=$(sed -n 's/.*validation accuracy = \([0-9.]*\).*/\1/p' "$TMP/out" | head -1)
    echo "{\"bench\": \"dist_train_bench\", \"mode\": \"$name\", \"metric\": \"global_steps_per_s\", \"value\": $rate, \"unit\": \"steps/s\", \"ps\": $ps, \"workers\": $workers, \"steps\": $STEPS, \"test_accuracy\": $acc}"
}

# peer SCRIPT NAME ARGS...: runs a PyTorch peer, prints its rate, leaves it in $theirs.
peer() {
    local script=$PEERS/$1 name=$2
    shift 2
    theirs=""
    if [ ! -f "$script" ] || ! /usr/bin/python3 -c "import torch" 2>/dev/null; then
        echo "dist_train_bench: peer $script or python3-torch missing; skipped the comparison" >&2
        return
    fi
    /usr/bin/python3 "$script" "$@" > "$TMP/peer" 2>&1 || true
    theirs=$(sed -n 's/^RESULT.* global_steps_per_s=\([0-9.]*\).*/\1/p; s/^RESULT.* steps_per_s=\([0-9.]*\).*/\1/p' "$TMP/peer" | head -1)
    if [ -z "$theirs" ]; then
        echo "dist_train_bench: the peer $script printed no RESULT line:" >&2
        tail -5 "$TMP/peer" >&2
        return
    fi
    local acc
    acc=$(sed -n 's/^RESULT.* test_acc=\([0-9.]*\).*/\1/p' "$TMP/peer" | head -1)
    echo "{\"bench\": \"dist_train_bench\", \"mode\": \"$name\", \"metric\": \"global_steps_per_s\", \"value\": $theirs, \"unit\": \"steps/s\", \"workers\": 2, \"test_accuracy\": ${acc:-null}}"
}

ratio() {   # ratio NAME OURS THEIRS
    [ -n "$3" ] && awk -v n="$1" -v o="$2" -v t="$3" \
        'BEGIN { printf "{\"bench\": \"dist_train_bench\", \"metric\": \"%s\", \"value\": %.2f, \"unit\": \"x\"}\n", n, o / t }'
    return 0
}

if [[ ",$MODES," == *,async,* ]]; then
    run async 1 1
    run async 1 2
    ours=$rate
    peer torch_ps.py torch_ps --workers 2 --steps 2000 --threads 1 --transport uv --max-seconds 300
    ratio speedup_async_vs_torch_ps "$ours" "$theirs"
fi
if [[ ",$MODES," == *,sync,* ]]; then
    run sync_replicas 1 2 --sync_replicas
    sync_rate=$rate
    run all_reduce 0 2 --all_reduce
    ar_rate=$rate
    peer torch_ddp.py torch_ddp --nprocs 2 --steps 2000
    ratio speedup_sync_replicas_vs_torch_ddp "$sync_rate" "$theirs"
    ratio speedup_all_reduce_vs_torch_ddp "$ar_rate" "$theirs"
fi
