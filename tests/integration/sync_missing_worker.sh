#!/usr/bin/env bash
# 2 sync workers, both gradients needed per step. Worker 1 killed with SIGKILL: the chief's
# take misses its gradient for --sync_timeout_ms and the chief exits non-zero with an error
# naming worker task 1, within the timeout plus slack (it does not hang).
source "$(dirname "$0")/common.bash"
read -r P0 P1 P2 <<< "$(free_ports 3)"
H="--ps_hosts 127.0.0.1:$P0 --worker_hosts 127.0.0.1:$P1,127.0.0.1:$P2"
S="--sync_replicas --sync_timeout_ms 3000 --train_steps 1000000 --quiet --log_every 100"
"$BIN/mnist_replica" --job_name ps --task_index 0 $H --quiet > "$TMP/ps" 2>&1 & PS=$!; PIDS+=($PS)
"$BIN/mnist_replica" --job_name worker --task_index 0 $H $S > "$TMP/w0" 2>&1 & W0=$!; PIDS+=($W0)
"$BIN/mnist_replica" --job_name worker --task_index 1 $H $S > "$TMP/w1" 2>&1 & W1=$!; PIDS+=($W1)
for _ in $(seq 300); do grep -q "training step" "$TMP/w1" && break; sleep 0.1; done
grep -q "training step" "$TMP/w1" || { cat "$TMP/w1"; fail "worker 1 never trained"; }
kill -9 "$W1"
start=$(date +%s%N)
rc=0
wait "$W0" || rc=$?
ms=$(( ($(date +%s%N) - start) / 1000000 ))
cat "$TMP/w0" | tail -3
echo "worker 0 exited with $rc after $ms ms"
[ "$rc" -ne 0 ] || fail "worker 0 exited 0 without worker 1's gradients"
# The 3000 ms take timeout ended it (the message says so; no bound on the time taken).
grep -q "gradients within 3000 ms" "$TMP/w0" || fail "the error does not name the 3000 ms timeout"
grep -q "no gradient from worker task 1" "$TMP/w0" || fail "the error does not name worker task 1"
grep -q "DEADLINE_EXCEEDED" "$TMP/w0" || fail "the error is not DEADLINE_EXCEEDED"
kill -0 "$PS" 2>/dev/null || fail "the ps died"
echo "PASS sync_missing_worker"
