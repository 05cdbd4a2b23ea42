#!/usr/bin/env bash
# Synchronous replicas survive a parameter-server restart, with real processes: 1 ps + 2
# workers train the MNIST-replica model with --sync_replicas and a checkpoint file; the ps is
# killed with SIGKILL mid-training and restarted on its port. Both workers recover (the chief
# restores the newest checkpoint and restarts its apply loop with fresh tokens), training ends
# at exactly --train_steps global steps, and both report the same test accuracy >= 0.82.
# The sync time-out (15 s) leaves room for the second worker's recovery on a loaded machine:
# with 5 s, a CI run once saw the chief's apply loop give up on it while it was reconnecting.
source "$(dirname "$0")/common.bash"
read -r P0 P1 P2 <<< "$(free_ports 3)"
STEPS=2000
H="--ps_hosts 127.0.0.1:$P0 --worker_hosts 127.0.0.1:$P1,127.0.0.1:$P2"
W="$H --train_steps $STEPS --quiet --log_every 100 --rpc_timeout_ms 2000 --recovery_attempts 30 \
   --checkpoint_path $TMP/ckpt.db --save_checkpoint_steps 100 --sync_replicas --sync_timeout_ms 15000"
start_ps() { "$BIN/mnist_replica" --job_name ps --task_index 0 $H --quiet >> "$TMP/ps" 2>&1 & PS=$!; PIDS+=($PS); }

start_ps
"$BIN/mnist_replica" --job_name worker --task_index 0 $W > "$TMP/w0" 2>&1 & W0=$!; PIDS+=($W0)
"$BIN/mnist_replica" --job_name worker --task_index 1 $W > "$TMP/w1" 2>&1 & W1=$!; PIDS+=($W1)
kill_and_restart_ps "$TMP/w0" 500 900
# On a failure every process's log is wanted: a worker that gave up waiting for the other one
# says why only in the other one's log.
dump() { for l in w0 w1 ps; do echo "--- $l"; tail -40 "$TMP/$l"; done; }

# The RPC deadline is raised to 2 * sync_timeout + 10 s for sync training: allow two of them.
for f in w0 w1; do
    pid=$W0; [ "$f" = w1 ] && pid=$W1
    for _ in $(seq 900); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -0 "$pid" 2>/dev/null && { dump; stacks "$pid" "$f"; fail "$f still runs 90 s after the ps restarted (hung?)"; }
    rc=0; wait "$pid" || rc=$?
    [ "$rc" -eq 0 ] || { dump; fail "$f exited with $rc"; }
    grep -q "recreated the session after a failure" "$TMP/$f" || { dump; fail "$f did not recover"; }
done
grep -q "restored checkpoint of global step" "$TMP/w0" || fail "the chief restored nothing"
echo "chief: $(grep -m1 'restored checkpoint' "$TMP/w0")"
for f in w0 w1; do
    final=$(sed -n 's/^After \([0-9]*\) training step(s).*/\1/p' "$TMP/$f")
    [ "$final" = "$STEPS" ] || fail "$f ended at global step '$final', expected exactly $STEPS"
done
a0=$(sed -n "s/.*validation accuracy = \([^ ]*\) .*/\1/p" "$TMP/w0")
a1=$(sed -n "s/.*validation accuracy = \([^ ]*\) .*/\1/p" "$TMP/w1")
check_number "worker 0's accuracy" "$a0"
[ "$a0" = "$a1" ] || fail "accuracies differ: '$a0' vs '$a1'"
check_ge "accuracy" "$a0" 0.82
echo "ps killed at $killed_at and restarted; both workers recovered; final global step $STEPS; accuracy $a0"
echo "PASS sync_recovery"
