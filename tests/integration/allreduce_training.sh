#!/usr/bin/env bash
# Synchronous all-reduce training (mnist_replica --all_reduce, no ps): 2 real worker processes
# train 2000 global steps; both end at global step 2000 with the same parameters (the same
# validation loss to the last digit) and test accuracy >= 0.84. Then a second run in which
# worker 1 is killed with SIGKILL: worker 0 fails with UNAVAILABLE naming worker task 1 as lost
# (after its recoveries find it gone), instead of hanging.
source "$(dirname "$0")/common.bash"
read -r P0 P1 <<< "$(free_ports 2)"
H="--worker_hosts 127.0.0.1:$P0,127.0.0.1:$P1"
"$BIN/mnist_replica" --job_name worker --task_index 0 $H --all_reduce --quiet --log_every 1000 > "$TMP/w0" 2>&1 & W0=$!; PIDS+=($W0)
"$BIN/mnist_replica" --job_name worker --task_index 1 $H --all_reduce --quiet --log_every 1000 > "$TMP/w1" 2>&1 & W1=$!; PIDS+=($W1)
wait "$W0" || { cat "$TMP/w0"; fail "worker 0 failed"; }
wait "$W1" || { cat "$TMP/w1"; fail "worker 1 failed"; }
for w in w0 w1; do tail -n 3 "$TMP/$w"; done
for w in w0 w1; do
    grep -q "After 2000 training step(s)" "$TMP/$w" || fail "$w did not stop at global step 2000"
    acc=$(sed -n 's/.*validation accuracy = \([^ ]*\) .*/\1/p' "$TMP/$w")
    check_ge "$w: test accuracy" "$acc" 0.84
done
l0=$(grep "validation cross entropy" "$TMP/w0" | sed 's/.*= //')
l1=$(grep "validation cross entropy" "$TMP/w1" | sed 's/.*= //')
check_number "worker 0's validation cross entropy" "$l0"
[ "$l0" = "$l1" ] || fail "the workers disagree: validation cross entropy $l0 vs $l1"

# Checkpoints: worker 0 saves; rerunning resumes (worker 0 restores, the others take its
# values and global step by broadcast), and a rerun at the stop step stops at once.
read -r P0 P1 <<< "$(free_ports 2)"
H="--worker_hosts 127.0.0.1:$P0,127.0.0.1:$P1"
C="--all_reduce --checkpoint_path $TMP/ckpt.db --save_checkpoint_steps 100 --quiet --log_every 1000 --sync_timeout_ms 10000"
for steps in 200 300 300; do
    "$BIN/mnist_replica" --job_name worker --task_index 0 $H $C --train_steps $steps > "$TMP/c0" 2>&1 & W0=$!; PIDS+=($W0)
    "$BIN/mnist_replica" --job_name worker --task_index 1 $H $C --train_steps $steps > "$TMP/c1" 2>&1 & W1=$!; PIDS+=($W1)
    wait "$W0" || { cat "$TMP/c0"; fail "checkpointed run to $steps: worker 0 failed"; }
    wait "$W1" || { cat "$TMP/c1"; fail "checkpointed run to $steps: worker 1 failed"; }
    for w in c0 c1; do grep -q "After $steps training step(s)" "$TMP/$w" || { cat "$TMP/$w"; fail "$w did not stop at $steps"; }; done
    l0=$(grep "validation cross entropy" "$TMP/c0" | sed 's/.*= //')
    l1=$(grep "validation cross entropy" "$TMP/c1" | sed 's/.*= //')
    [ "$l0" = "$l1" ] || fail "run to $steps: the workers disagree ($l0 vs $l1)"
done
grep -q "restored checkpoint of global step 300" "$TMP/c0" || fail "worker 0 did not restore step 300"
grep -q "Training elapsed time: .* (0 local steps" "$TMP/c1" || fail "worker 1 trained past the stop step"
grep -Eq '^loss ' <<<"$("$BIN/dg-inspect" summaries "$TMP/ckpt.db")" || fail "no loss summaries in the checkpoint file"

# A missing worker.
read -r P0 P1 <<< "$(free_ports 2)"
H="--worker_hosts 127.0.0.1:$P0,127.0.0.1:$P1"
S="--all_reduce --sync_timeout_ms 3000 --train_steps 1000000 --quiet --log_every 100"
"$BIN/mnist_replica" --job_name worker --task_index 0 $H $S > "$TMP/k0" 2>&1 & W0=$!; PIDS+=($W0)
"$BIN/mnist_replica" --job_name worker --task_index 1 $H $S > "$TMP/k1" 2>&1 & W1=$!; PIDS+=($W1)
for _ in $(seq 300); do grep -q "training step" "$TMP/k1" && break; sleep 0.1; done
grep -q "training step" "$TMP/k1" || { cat "$TMP/k1"; fail "worker 1 never trained"; }
kill -9 "$W1"
start=$(date +%s%N)
rc=0
wait "$W0" || rc=$?
ms=$(( ($(date +%s%N) - start) / 1000000 ))
tail -n 2 "$TMP/k0"
echo "worker 0 exited with $rc after $ms ms"
[ "$rc" -ne 0 ] || fail "worker 0 exited 0 without worker 1"
# Worker 1's connections closed with it: the all-reduce waiting for it ended at once,
# UNAVAILABLE naming it, and so did the step on each fresh session the recovery made (the
# group's 3000 ms timeout did not have to run out).
grep -q "UNAVAILABLE" "$TMP/k0" || fail "the error is not UNAVAILABLE"
grep -q "member /job:worker/task:1 is lost" "$TMP/k0" || fail "the error does not name worker task 1 as lost"
grep -q "gave up after" "$TMP/k0" || fail "the recovery did not give up"
echo "PASS allreduce_training"
