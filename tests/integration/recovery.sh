#!/usr/bin/env bash
# Recovery under the monitored session, with real processes: 1 ps + 2 workers train the
# MNIST-replica model with a checkpoint file. The ps is killed with SIGKILL mid-training and
# restarted on its port: the chief restores the newest checkpoint, the other worker waits for it,
# and both train on. Then worker 1 is killed and restarted: it rejoins and trains. Training stops
# at --train_steps with test accuracy >= 0.82; rerunning the chief alone resumes from the newest
# checkpoint (the final one) and trains no further.
source "$(dirname "$0")/common.bash"
read -r P0 P1 P2 <<< "$(free_ports 3)"
STEPS=10000   # the restarted worker must load its data and rejoin before the chief ends alone
H="--ps_hosts 127.0.0.1:$P0 --worker_hosts 127.0.0.1:$P1,127.0.0.1:$P2"
W="$H --train_steps $STEPS --quiet --log_every 100 --rpc_timeout_ms 2000 --recovery_attempts 30 \
   --checkpoint_path $TMP/ckpt.db --save_checkpoint_steps 100"
start_ps() { "$BIN/mnist_replica" --job_name ps --task_index 0 $H --quiet >> "$TMP/ps" 2>&1 & PS=$!; PIDS+=($PS); }
# Waits up to $2 tenths of a second for a line matching $3 in log $1.
wait_for() {
    for _ in $(seq "$2"); do grep -q "$3" "$1" && return 0; sleep 0.1; done
    return 1
}

start_ps
"$BIN/mnist_replica" --job_name worker --task_index 0 $W > "$TMP/w0" 2>&1 & W0=$!; PIDS+=($W0)
"$BIN/mnist_replica" --job_name worker --task_index 1 $W > "$TMP/w1" 2>&1 & W1=$!; PIDS+=($W1)
wait_for "$TMP/w0" 300 "initialized variables" || { cat "$TMP/w0"; fail "the chief did not initialize"; }

# Kill the ps once a few checkpoints exist.
kill_and_restart_ps "$TMP/w0" 800 600
echo "restarted the ps on port $P0"

wait_for "$TMP/w0" 600 "recreated the session after a failure" || { cat "$TMP/w0"; fail "the chief did not recover"; }
wait_for "$TMP/w0" 300 "restored checkpoint of global step" || { cat "$TMP/w0"; fail "the chief restored nothing"; }
restored=$(sed -n 's/.*restored checkpoint of global step \([0-9]*\).*/\1/p' "$TMP/w0" | head -1)
echo "chief: $(grep -m1 'restored checkpoint' "$TMP/w0")"
# The log lags the true step by up to --log_every local steps of each worker.
[ "$restored" -ge 100 ] && [ "$restored" -le $((killed_at + 300)) ] ||
    fail "restored step $restored: expected one in [100, $((killed_at + 300))]"
wait_for "$TMP/w1" 600 "recreated the session after a failure" || { cat "$TMP/w1"; fail "worker 1 did not recover"; }

# Worker 1 trains again after the recovery; then it is killed and restarted.
n_before=$(grep -c "training step [0-9]* done" "$TMP/w1" || true)
for _ in $(seq 300); do [ "$(grep -c "training step [0-9]* done" "$TMP/w1" || true)" -gt "$n_before" ] && break; sleep 0.1; done
[ "$(grep -c "training step [0-9]* done" "$TMP/w1" || true)" -gt "$n_before" ] || { cat "$TMP/w1"; fail "worker 1 did not train after the recovery"; }
kill -9 "$W1"
wait "$W1" 2>/dev/null || true
echo "killed worker 1 at: $(grep "training step [0-9]* done" "$TMP/w1" | tail -1)"
"$BIN/mnist_replica" --job_name worker --task_index 1 $W --log_every 10 > "$TMP/w1b" 2>&1 & W1B=$!; PIDS+=($W1B)

rc=0
wait "$W0" || rc=$?
tail -4 "$TMP/w0"
[ "$rc" -eq 0 ] || { cat "$TMP/w0"; fail "the chief exited with $rc"; }
rc=0
wait "$W1B" || rc=$?
tail -3 "$TMP/w1b"
[ "$rc" -eq 0 ] || { cat "$TMP/w1b"; fail "the restarted worker 1 exited with $rc"; }
grep -q "the chief has initialized the variables" "$TMP/w1b" || fail "the restarted worker 1 did not rejoin"
grep -q "training step [0-9]* done" "$TMP/w1b" || fail "the restarted worker 1 did not train"

for f in w0 w1b; do
    acc=$(sed -n "s/.*validation accuracy = \([^ ]*\) .*/\1/p" "$TMP/$f")
    check_ge "$f accuracy" "$acc" 0.82
done
final=$(sed -n 's/^After \([0-9]*\) training step(s).*/\1/p' "$TMP/w0")
[ -n "$final" ] && [ "$final" -ge "$STEPS" ] && [ "$final" -lt $((STEPS + 100)) ] ||
    fail "the chief stopped at global step '$final', expected $STEPS..$((STEPS + 99))"

# The same command again: the chief restores the final checkpoint and does not train.
"$BIN/mnist_replica" --job_name worker --task_index 0 $W > "$TMP/w0b" 2>&1 || { cat "$TMP/w0b"; fail "the rerun failed"; }
# Training is asynchronous: the other worker may finish a step or two between the chief's last
# step and its final save, so the final checkpoint holds $final or a little more.
again=$(sed -n 's/.*restored checkpoint of global step \([0-9]*\).*/\1/p' "$TMP/w0b")
[ -n "$again" ] && [ "$again" -ge "$final" ] && [ "$again" -lt $((STEPS + 100)) ] ||
    { cat "$TMP/w0b"; fail "the rerun restored step '$again', expected $final..$((STEPS + 99))"; }
grep -q "After $again training step(s)" "$TMP/w0b" || fail "the rerun trained on"
grep -q "training step [0-9]* done" "$TMP/w0b" && fail "the rerun trained on"
acc=$(sed -n "s/.*validation accuracy = \([^ ]*\) .*/\1/p" "$TMP/w0b")
check_ge "the rerun's accuracy" "$acc" 0.82
grep -h "recreated\|restored\|initialized\|waiting" "$TMP/w0" "$TMP/w1" "$TMP/w1b" "$TMP/w0b"
echo "restored at $restored after the ps was killed at $killed_at; final step $final; rerun accuracy $acc"
echo "PASS recovery"
