#!/usr/bin/env bash
# The ps is killed with SIGKILL mid-training: the worker's step fails with UNAVAILABLE naming
# the ps task within the deadline, instead of hanging.
source "$(dirname "$0")/common.bash"
read -r P0 P1 <<< "$(free_ports 2)"
H="--ps_hosts 127.0.0.1:$P0 --worker_hosts 127.0.0.1:$P1"
"$BIN/mnist_replica" --job_name ps --task_index 0 $H --quiet > "$TMP/ps" 2>&1 & PS=$!; PIDS+=($PS)
"$BIN/mnist_replica" --job_name worker --task_index 0 $H --train_steps 1000000 --quiet --log_every 200 \
    --rpc_timeout_ms 2000 > "$TMP/w0" 2>&1 & W0=$!; PIDS+=($W0)
for _ in $(seq 100); do grep -q "training step" "$TMP/w0" && break; sleep 0.1; done
grep -q "training step" "$TMP/w0" || { cat "$TMP/w0"; fail "the worker never trained"; }
kill -9 "$PS"
start=$(date +%s.%N)
rc=0
# The deadline is 2 s; allow generous slack for a loaded machine, but not a hang.
timeout 20 tail --pid="$W0" -f /dev/null || fail "the worker still runs 20 s after the ps died"
wait "$W0" || rc=$?
end=$(date +%s.%N)
tail -2 "$TMP/w0"
[ "$rc" -ne 0 ] || fail "the worker exited 0 although its ps is gone"
grep -q "UNAVAILABLE" "$TMP/w0" || fail "no UNAVAILABLE in the worker's error"
grep -q "/job:ps/replica:0/task:0" "$TMP/w0" || fail "the error does not name the ps task"
awk -v a="$start" -v b="$end" 'BEGIN { printf "worker failed %.2f s after the ps died\n", b - a }'
echo "PASS ps_killed"
