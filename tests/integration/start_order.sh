#!/usr/bin/env bash
# Start order is not guaranteed on real clusters: a worker started before its ps waits for it
# (logging which task at which address it waits for) and trains once it is up; with
# --wait_for_tasks_ms the wait is bounded and the worker fails with UNAVAILABLE naming the ps.
source "$(dirname "$0")/common.bash"
read -r P0 P1 <<< "$(free_ports 2)"
H="--ps_hosts 127.0.0.1:$P0 --worker_hosts 127.0.0.1:$P1"
"$BIN/mnist_replica" --job_name worker --task_index 0 $H --train_steps 300 --quiet > "$TMP/w" 2>&1 & W=$!
PIDS+=($W)
# The line comes after 5 s of waiting, counted once the worker has loaded its data and built
# its graph: poll for it (a fixed sleep of 7 s once missed it under a loaded ctest -j2).
for _ in $(seq 600); do
    grep -q "waiting for /job:ps/replica:0/task:0 at tcp://127.0.0.1:$P0" "$TMP/w" && break
    kill -0 "$W" 2>/dev/null || { cat "$TMP/w"; fail "the worker did not wait for its ps"; }
    sleep 0.1
done
grep -q "waiting for /job:ps/replica:0/task:0 at tcp://127.0.0.1:$P0" "$TMP/w" || { cat "$TMP/w"; fail "no line saying what the worker waits for within 60 s"; }
kill -0 "$W" 2>/dev/null || { cat "$TMP/w"; fail "the worker did not wait for its ps"; }
"$BIN/mnist_replica" --job_name ps --task_index 0 $H --quiet > "$TMP/ps" 2>&1 & PS=$!
PIDS+=($PS)
wait "$W" || { cat "$TMP/w"; fail "the worker failed once its ps was up"; }
grep "answers after\|validation accuracy" "$TMP/w"
kill "$PS"
read -r P0 P1 <<< "$(free_ports 2)"
H="--ps_hosts 127.0.0.1:$P0 --worker_hosts 127.0.0.1:$P1"
rc=0
timeout 60 "$BIN/mnist_replica" --job_name worker --task_index 0 $H --train_steps 300 --quiet \
    --wait_for_tasks_ms 1500 --recovery_attempts 1 > "$TMP/w2" 2>&1 || rc=$?
tail -1 "$TMP/w2"
[ "$rc" = 1 ] || { cat "$TMP/w2"; fail "expected exit 1 without a ps and a bounded wait, got $rc"; }
grep -q "UNAVAILABLE.*/job:ps/replica:0/task:0 at tcp://127.0.0.1:$P0 did not answer within 1500 ms" "$TMP/w2" ||
    fail "the error does not name the ps it waited for"
echo "PASS start_order"
