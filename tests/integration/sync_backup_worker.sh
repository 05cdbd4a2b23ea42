#!/usr/bin/env bash
# 3 sync workers, 2 gradients per step: one backup. Worker 2 killed with SIGKILL mid-run does
# not stop the others, which end at the stop step exactly.
source "$(dirname "$0")/common.bash"
read -r P0 P1 P2 P3 <<< "$(free_ports 4)"
H="--ps_hosts 127.0.0.1:$P0 --worker_hosts 127.0.0.1:$P1,127.0.0.1:$P2,127.0.0.1:$P3"
S="--sync_replicas --replicas_to_aggregate 2 --sync_timeout_ms 20000 --train_steps 1500 --quiet --log_every 100"
"$BIN/mnist_replica" --job_name ps --task_index 0 $H --quiet > "$TMP/ps" 2>&1 & PS=$!; PIDS+=($PS)
for i in 0 1 2; do
    "$BIN/mnist_replica" --job_name worker --task_index $i $H $S > "$TMP/w$i" 2>&1 & W[$i]=$!; PIDS+=(${W[$i]})
done
for _ in $(seq 300); do grep -q "training step" "$TMP/w2" && break; sleep 0.1; done
grep -q "training step" "$TMP/w2" || { cat "$TMP/w2"; fail "worker 2 never trained"; }
kill -9 "${W[2]}"
echo "killed worker 2 at: $(grep 'training step' "$TMP/w2" | tail -1)"
for i in 0 1; do
    rc=0
    wait "${W[$i]}" || rc=$?
    tail -2 "$TMP/w$i"
    [ "$rc" -eq 0 ] || { cat "$TMP/w$i"; fail "worker $i exited with $rc after worker 2 was killed"; }
    grep -q "After 1500 training step(s)" "$TMP/w$i" || fail "worker $i did not end at global step 1500"
done
kill -0 "$PS" 2>/dev/null || fail "the ps died"
echo "PASS sync_backup_worker"
