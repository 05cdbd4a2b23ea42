#!/usr/bin/env bash
# abort_marks_bench: does a ps that holds many abort marks train slower? (A ps is told to abort
# steps that never run there by masters that die; these marks were once a linear list, and
# 60,000 of them cut training speed by 41% for good.) MNIST-replica, 1 ps (a standing
# dg-server) + 2 workers, STEPS global steps, ROUNDS times on a fresh ps each way, alternating:
# one with no marks, one after a peer sent it MARKS ABORT_STEP messages for steps that never
# run there (tests/tools/hostile_peer). JSON lines; the ratio of the medians last.
#   MARKS=60000 STEPS=3000 ROUNDS=3 bench/abort_marks_bench.sh
set -euo pipefail
cd "$(dirname "$0")/.."
STEPS=${STEPS:-3000}
MARKS=${MARKS:-60000}
BIN=${DG_BIN_DIR:-build/bin}
source bench/lib.bash
start_ps() {   # start_ps PORT: a fresh standing ps on PORT
    "$BIN/dg-server" --cluster_spec "ps|127.0.0.1:$1;worker|127.0.0.1:$W0,127.0.0.1:$W1" --job_name ps \
        --task_index 0 --quiet > "$TMP/ps_$1.log" 2>&1 &
    PS=$!
    PIDS+=($PS)
    for _ in $(seq 100); do "$BIN/dg-inspect" server "dg://127.0.0.1:$1" > /dev/null 2>&1 && return 0; sleep 0.05; done
    echo "abort_marks_bench: the ps did not come up" >&2
    exit 1
}
train() {   # train PSPORT NAME: the two workers, STEPS global steps; prints the rate
    local w=()
    for i in 0 1; do
        env -u DG_KEY_DIR "$BIN/mnist_replica" --job_name worker --task_index $i --ps_hosts "127.0.0.1:$1" \
            --worker_hosts "127.0.0.1:$W0,127.0.0.1:$W1" --train_steps "$STEPS" --log_every 1000000 --quiet \
            > "$TMP/$2_$i" 2>&1 &
        w+=($!)
    done
    for p in "${w[@]}"; do wait "$p" || { cat "$TMP/$2"_*; exit 1; }; done
    rate "$TMP/$2_0" "$TMP/$2_1"
}
line() { echo "{\"bench\": \"abort_marks_bench\", \"run\": \"$1\", \"metric\": \"global_steps_per_s\", \"value\": $2, \"abort_marks\": $3, \"steps\": $STEPS}"; }
ROUNDS=${ROUNDS:-3}
: > "$TMP/without"
: > "$TMP/with"
for r in $(seq "$ROUNDS"); do
    read -r P0 P1 W0 W1 <<< "$(ports 4)"
    start_ps "$P0"   # a fresh ps, no marks
    v=$(train "$P0" "plain$r")
    echo "$v" >> "$TMP/without"
    line "without_marks" "$v" 0
    kill -9 "$PS"
    start_ps "$P1"   # a fresh ps, told to abort MARKS steps that never run there
    "$BIN/hostile_peer" --target "127.0.0.1:$P1" --pid "$PS" --scenario abort_marks --connections "$MARKS" > /dev/null
    marks=$("$BIN/dg-inspect" server "dg://127.0.0.1:$P1" | awk '$1 == "abort_marks" { print $2 }')
    [ "$marks" -ge "$MARKS" ] || { echo "abort_marks_bench: the ps holds $marks marks, not $MARKS" >&2; exit 1; }
    v=$(train "$P1" "marks$r")
    echo "$v" >> "$TMP/with"
    line "with_marks" "$v" "$marks"
    kill -9 "$PS"
done
a=$(median < "$TMP/with")
b=$(median < "$TMP/without")
awk -v a="$a" -v b="$b" -v r="$ROUNDS" 'BEGIN {
    printf "{\"bench\": \"abort_marks_bench\", \"metric\": \"with_marks_over_without_median\", \"value\": %.3f, \"with\": %s, \"without\": %s, \"unit\": \"x\", \"rounds\": %d}\n", a / b, a, b, r }'
