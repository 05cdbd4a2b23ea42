#!/usr/bin/env bash
# mnist_replica reading its training batches through a dataset (--tfrecord: dg-tfrecord's shards
# of Fashion-MNIST's training set -> interleave -> shard -> shuffle -> repeat -> parse -> batch ->
# prefetch, examples/common/mnist_replica_model.c), one worker process:
#  1. the default 2000 steps reach a test accuracy >= 0.84 with the dataset, as with the arrays
#     in memory (both >= 0.84: seeds 1 to 3 gave 0.853 to 0.866 from the arrays and 0.852 to
#     0.854 from the dataset), and the run prints its input wait and step time as numbers;
#  2. resuming: 150 steps with --checkpoint_path, stopped, then started again to 300, restores
#     the iterator's position from the checkpoint of step 150 (it says "batch 150"), and the 300
#     batch hashes of the two runs (--print_batch_hash) are those of one uninterrupted run to
#     300, in order; a fresh iterator after the restart would repeat the first 150;
#  3. a recovery mid-run (1 ps + 1 worker, the ps killed and started again): the input goes
#     back with the variables to the checkpoint restored, and the batches that follow are the
#     uninterrupted run's from there.
# The examples read Fashion-MNIST from Debian's dataset-fashion-mnist; without it: SKIP.
source "$(dirname "$0")/common.bash"
FMNIST_DIR=${FMNIST_DIR:-/usr/share/datasets/fashion-mnist}
for f in train-images-idx3-ubyte train-labels-idx1-ubyte t10k-images-idx3-ubyte t10k-labels-idx1-ubyte; do
    [ -f "$FMNIST_DIR/$f.gz" ] || { echo "SKIP: no $FMNIST_DIR/$f.gz (apt-get install dataset-fashion-mnist)"; exit 77; }
done
cd "$TMP"
for f in train-images-idx3-ubyte train-labels-idx1-ubyte; do gunzip -c "$FMNIST_DIR/$f.gz" > "$f"; done
mkdir shards
"$BIN/dg-tfrecord" idx --images train-images-idx3-ubyte --labels train-labels-idx1-ubyte --out shards/fmnist \
    --shards 4 > shards.txt 2>&1 || { cat shards.txt; fail "dg-tfrecord idx"; }
[ "$(ls shards | wc -l)" -eq 4 ] || fail "dg-tfrecord wrote $(ls shards | wc -l) shards, not 4"

read -r -a ports <<< "$(free_ports 5)"
run() {   # run PORT LOG FLAGS...: one worker, no ps
    local port=$1 log=$2
    shift 2
    "$BIN/mnist_replica" --worker_hosts "127.0.0.1:$port" --job_name worker --task_index 0 --quiet \
        --log_every 100000 "$@" > "$log" 2>&1 || { cat "$log"; fail "mnist_replica $* exited non-zero"; }
}
accuracy() { sed -n 's/^Worker 0: validation accuracy = \([^ ]*\) .*/\1/p' "$1"; }

# 1. Accuracy with the arrays and with the dataset.
run "${ports[0]}" memory.log
run "${ports[1]}" dataset.log --tfrecord shards
mem=$(accuracy memory.log)
ds=$(accuracy dataset.log)
echo "accuracy after 2000 steps: arrays $mem, dataset $ds"
check_ge "the arrays' accuracy" "$mem" 0.84
check_ge "the dataset's accuracy" "$ds" 0.84
grep "input:" dataset.log
wait_ms=$(sed -n 's/^Worker 0: input: \([^ ]*\) ms waiting for the next batch per step, mean step .*/\1/p' dataset.log)
step_ms=$(sed -n 's/^Worker 0: input: .*, mean step \([^ ]*\) ms .*/\1/p' dataset.log)
check_ge "the input wait per step" "$wait_ms" 0
check_ge "the mean step" "$step_ms" 0
! grep -q "input:" memory.log || fail "the run from the arrays reports a dataset's input wait"

# 2. Stop at 150, restart to 300; against one run to 300.
flags=(--tfrecord "shards/fmnist-*.tfrecord" --print_batch_hash --save_checkpoint_steps 50)
run "${ports[2]}" first.log "${flags[@]}" --train_steps 150 --checkpoint_path resumed.db
run "${ports[3]}" second.log "${flags[@]}" --train_steps 300 --checkpoint_path resumed.db
run "${ports[4]}" whole.log "${flags[@]}" --train_steps 1000 --checkpoint_path whole.db
hashes() { sed -n 's/^Worker 0: batch of local step \([0-9]*\): hash \([0-9a-f]*\)$/\2/p' "$@"; }
hashes first.log second.log > resumed.hashes
hashes whole.log > whole1000.hashes
head -300 whole1000.hashes > whole.hashes
[ "$(wc -l < resumed.hashes)" -eq 300 ] || fail "the two runs printed $(wc -l < resumed.hashes) batch hashes, not 300"
[ "$(wc -l < whole.hashes)" -eq 300 ] || fail "the whole run printed $(wc -l < whole.hashes) batch hashes, not 300"
[ "$(sort -u whole.hashes | wc -l)" -eq 300 ] || fail "the whole run's 300 batches are not all different"
if ! cmp -s resumed.hashes whole.hashes; then
    diff <(cat -n resumed.hashes) <(cat -n whole.hashes) | head -6 || true
    fail "the batches of the stopped and restarted runs differ from the uninterrupted run's"
fi
grep -q "^Worker 0: restored checkpoint of global step 150$" second.log || { cat second.log; fail "the restart restored no checkpoint of step 150"; }
grep "input position restored" second.log ||
    { cat second.log; fail "the restart printed no restored input position"; }
grep -q "^Worker 0: input position restored from the checkpoint of global step 150: batch 150$" second.log ||
    fail "the restart did not restore the input at batch 150"
grep -q "input position restored" whole.log first.log && fail "a fresh run says it restored an input position"
# 3. A recovery mid-run: with a ps, the ps is killed at local step 300 or later and started again;
# the worker's session is created again and restores the newest checkpoint (global step C), and
# its input goes back to batch C with the variables. Its batches are then the uninterrupted
# run's: the first K (K = those drawn before the failure), then those from C on.
read -r -a ports <<< "$(free_ports 2)"
STEPS=1000
H=(--ps_hosts "127.0.0.1:${ports[0]}" --worker_hosts "127.0.0.1:${ports[1]}")
start_ps() { "$BIN/mnist_replica" --job_name ps --task_index 0 "${H[@]}" --quiet >> ps.log 2>&1 & PS=$!; PIDS+=($PS); }
start_ps
"$BIN/mnist_replica" --job_name worker --task_index 0 "${H[@]}" "${flags[@]}" --train_steps $STEPS --quiet \
    --log_every 10 --checkpoint_path recovered.db --rpc_timeout_ms 2000 --recovery_attempts 30 > recovered.log 2>&1 &
W0=$!
PIDS+=($W0)
kill_and_restart_ps recovered.log 300 600
wait "$W0" || { tail -20 recovered.log; fail "the worker that recovered exited non-zero"; }
grep -q "recreated the session after a failure" recovered.log || { cat recovered.log; fail "the worker did not recover"; }
C=$(sed -n 's/^Worker 0: restored checkpoint of global step \([0-9]*\)$/\1/p' recovered.log | head -1)
check_number "the step the recovery restored" "$C"
hashes recovered.log > recovered.hashes
L=$(wc -l < recovered.hashes)   # one per local step, the steps undone by the recovery included
K=$(sed '/recreated the session after a failure/q' recovered.log | hashes /dev/stdin | wc -l)
echo "recovery: the ps killed at global step $killed_at; restored step $C; $K batches drawn before, $L in all"
[ "$C" -ge 50 ] && [ "$K" -gt "$C" ] && [ "$K" -lt "$L" ] && [ $((C + L - K)) -le "$STEPS" ] ||
    fail "restored step $C, $K batches before the failure: not a recovery to a checkpoint"
cmp -s <(head -"$K" recovered.hashes) <(head -"$K" whole1000.hashes) ||
    fail "the batches before the failure are not the uninterrupted run's"
if ! cmp -s <(tail -n +$((K + 1)) recovered.hashes) <(tail -n +$((C + 1)) whole1000.hashes | head -$((L - K))); then
    diff <(tail -n +$((K + 1)) recovered.hashes | head -3) <(tail -n +$((C + 1)) whole1000.hashes | head -3) || true
    fail "after the recovery to step $C the batches are not the uninterrupted run's from batch $C on"
fi
echo "PASS dataset_training (accuracy: arrays $mem, dataset $ds; input ${wait_ms} ms of a ${step_ms} ms step;" \
    "resumed at batch 150, 300 batches as uninterrupted; recovered to batch $C)"
