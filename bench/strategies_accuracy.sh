#!/usr/bin/env bash
# strategies_accuracy: the test accuracy each strategy of examples/strategies.c (the MNIST-replica
# model written once, distgraph/distribute.h) reaches on Fashion-MNIST, beside the accuracy of
# the example that strategy had before the one API, in one run: mirrored and central storage
# over 2 virtual CPUs (examples/mirrored.c), multi-worker mirrored over 2 workers
# (mnist_replica --all_reduce), the asynchronous parameter server and sync replicas with 1 ps
# and 2 workers (mnist_replica, --sync_replicas), 2000 steps, and ps_coordinator with 1 ps and 2
# standing workers (examples/ps_coordinator.c), 3000 steps at rate 0.005. JSON lines: strategy,
# the accuracy of each of strategies.c's processes that reports one, and the example's.
#   bench/strategies_accuracy.sh
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${DG_BIN_DIR:-build/bin}
source bench/lib.bash
launch() { "$BIN/dg-launch" --timeout 600 --quiet "$@" > "$TMP/out" 2>&1 || { cat "$TMP/out" >&2; exit 1; }; }
# accs PATTERN: the accuracies on the lines of $TMP/out that PATTERN (sed) matches, comma-joined.
accs() { sed -n "$1" "$TMP/out" | paste -sd, -; }
strat='s/.* test accuracy \([0-9.]*\), cross entropy .*/\1/p'
row() {
    echo "{\"bench\": \"strategies_accuracy\", \"strategy\": \"$1\", \"strategies_c\": [$2], \"own_example\": \"$3\", \"own_example_accuracy\": [$4]}"
}
for s in mirrored central_storage; do
    "$BIN/strategies" --strategy $s --num_devices 2 --train_steps 2000 --log_every 1000000 > "$TMP/out" 2>&1
    a=$(accs "$strat")
    "$BIN/mirrored" --strategy $s --num_devices 2 --train_steps 2000 > "$TMP/out" 2>&1
    row $s "$a" "mirrored --strategy $s" "$(accs 's/^test accuracy \([0-9.]*\),.*/\1/p')"
done
replica='s/.*validation accuracy = \([0-9.]*\) .*/\1/p'
launch --workers 2 -- "$BIN/strategies" --strategy multi_worker_mirrored --train_steps 2000 --log_every 1000000 --quiet
a=$(accs "$strat")
launch --workers 2 -- "$BIN/mnist_replica" --all_reduce --train_steps 2000
row multi_worker_mirrored "$a" "mnist_replica --all_reduce" "$(accs "$replica")"
launch --ps 1 --workers 2 -- "$BIN/strategies" --strategy parameter_server --train_steps 2000 --log_every 1000000 --quiet
a=$(accs "$strat")
launch --ps 1 --workers 2 -- "$BIN/mnist_replica" --train_steps 2000
row parameter_server "$a" "mnist_replica" "$(accs "$replica")"
launch --ps 1 --workers 2 -- "$BIN/strategies" --strategy sync_replicas --train_steps 2000 --log_every 1000000 --quiet
a=$(accs "$strat")
launch --ps 1 --workers 2 -- "$BIN/mnist_replica" --sync_replicas --train_steps 2000
row sync_replicas "$a" "mnist_replica --sync_replicas" "$(accs "$replica")"
launch --ps 1 --workers 2 --mode coordinator -- "$BIN/strategies" --strategy ps_coordinator --train_steps 3000 \
    --learning_rate 0.005 --log_every 1000000 --quiet
a=$(accs "$strat")
launch --ps 1 --workers 2 --mode standing -- "$BIN/ps_coordinator" --train_steps 3000 --learning_rate 0.005
row ps_coordinator "$a" "ps_coordinator" "$(accs 's/.*Coordinator: validation accuracy = \([0-9.]*\) .*/\1/p')"
