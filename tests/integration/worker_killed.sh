#!/usr/bin/env bash
# A worker killed with SIGKILL mid-training stops neither the ps nor the other worker.
source "$(dirname "$0")/common.bash"
read -r P0 P1 P2 <<< "$(free_ports 3)"
H="--ps_hosts 127.0.0.1:$P0 --worker_hosts 127.0.0.1:$P1,127.0.0.1:$P2"
"$BIN/mnist_replica" --job_name ps --task_index 0 $H --quiet > "$TMP/ps" 2>&1 & PS=$!; PIDS+=($PS)
"$BIN/mnist_replica" --job_name worker --task_index 0 $H --train_steps 3000 --quiet --log_every 200 > "$TMP/w0" 2>&1 & W0=$!; PIDS+=($W0)
"$BIN/mnist_replica" --job_name worker --task_index 1 $H --train_steps 1000000 --quiet --log_every 200 > "$TMP/w1" 2>&1 & W1=$!; PIDS+=($W1)
# Kill worker 1 once it is training.
for _ in $(seq 100); do grep -q "training step" "$TMP/w1" && break; sleep 0.1; done
grep -q "training step" "$TMP/w1" || { cat "$TMP/w1"; fail "worker 1 never trained"; }
kill -9 "$W1"
echo "killed worker 1 at: $(grep 'training step' "$TMP/w1" | tail -1)"
rc=0
wait "$W0" || rc=$?
tail -3 "$TMP/w0"
[ "$rc" -eq 0 ] || fail "worker 0 exited with $rc after worker 1 was killed"
kill -0 "$PS" 2>/dev/null || fail "the ps died"
grep -q "validation accuracy" "$TMP/w0" || fail "worker 0 did not finish"
echo "PASS worker_killed"
