#!/usr/bin/env bash
# Non-chief workers wait for the chief under the monitored session, with real processes:
# a non-chief started before the chief waits (and does not train) until the chief has
# initialized the variables, then trains; a non-chief whose chief never comes exits with
# DEADLINE_EXCEEDED naming what it waited for, after its short --wait_for_chief_ms; and so does
# one whose ps is not up either, giving the last failed check.
source "$(dirname "$0")/common.bash"

# 1. The non-chief first, the chief 2 s later.
read -r P0 P1 P2 <<< "$(free_ports 3)"
H="--ps_hosts 127.0.0.1:$P0 --worker_hosts 127.0.0.1:$P1,127.0.0.1:$P2"
"$BIN/mnist_replica" --job_name ps --task_index 0 $H --quiet > "$TMP/ps" 2>&1 & PS=$!; PIDS+=($PS)
"$BIN/mnist_replica" --job_name worker --task_index 1 $H --train_steps 4000 --quiet --log_every 100 \
    --wait_for_chief_ms 60000 > "$TMP/w1" 2>&1 & W1=$!; PIDS+=($W1)
for _ in $(seq 100); do grep -q "waiting for the chief" "$TMP/w1" && break; sleep 0.1; done
sleep 2
kill -0 "$W1" 2>/dev/null || { cat "$TMP/w1"; fail "the non-chief did not wait for the chief"; }
grep -q "waiting for the chief to initialize the variables" "$TMP/w1" || { cat "$TMP/w1"; fail "no waiting line"; }
grep -q "Training begins" "$TMP/w1" && { cat "$TMP/w1"; fail "the non-chief trained before the chief came"; }
"$BIN/mnist_replica" --job_name worker --task_index 0 $H --train_steps 4000 --quiet --log_every 100 \
    > "$TMP/w0" 2>&1 & W0=$!; PIDS+=($W0)
rc=0
wait "$W1" || rc=$?
[ "$rc" -eq 0 ] || { cat "$TMP/w1"; fail "the waiting non-chief exited with $rc"; }
wait "$W0" || { cat "$TMP/w0"; fail "the chief failed"; }
grep "Worker" "$TMP/w1" | grep -v "training step" | tail -4
grep -q "the chief has initialized the variables" "$TMP/w1" || fail "the non-chief never saw the variables ready"
grep -q "training step [0-9]* done" "$TMP/w1" || fail "the non-chief did not train"
grep -q "Worker 1: validation accuracy" "$TMP/w1" || fail "the non-chief did not finish"
grep -q "Worker 0: initialized variables" "$TMP/w0" || fail "the chief did not initialize"
kill -9 "$PS"

# 2. A chief that never comes: the non-chief gives up after 1500 ms, naming the variables.
read -r P0 P1 P2 <<< "$(free_ports 3)"
H="--ps_hosts 127.0.0.1:$P0 --worker_hosts 127.0.0.1:$P1,127.0.0.1:$P2"
"$BIN/mnist_replica" --job_name ps --task_index 0 $H --quiet > "$TMP/ps2" 2>&1 & PS=$!; PIDS+=($PS)
start=$(date +%s.%N)
rc=0
timeout 30 "$BIN/mnist_replica" --job_name worker --task_index 1 $H --train_steps 100 --quiet \
    --wait_for_chief_ms 1500 > "$TMP/w1b" 2>&1 || rc=$?
end=$(date +%s.%N)
tail -1 "$TMP/w1b"
[ "$rc" -eq 1 ] || { cat "$TMP/w1b"; fail "expected exit 1 from the non-chief without a chief, got $rc"; }
grep -q "DEADLINE_EXCEEDED: waited 1500 ms for the chief to initialize variables: hid_w, hid_b, sm_w, sm_b" \
    "$TMP/w1b" || fail "the error does not say what the non-chief waited for"
grep -q "global_step" "$TMP/w1b" || fail "the error does not name the global step"
# Not early; that the 1500 ms wait ended it the message says (no upper bound on a loaded machine).
awk -v a="$start" -v b="$end" 'BEGIN { d = b - a; printf "gave up after %.2f s\n", d; exit !(d >= 1.5) }' ||
    fail "the non-chief gave up before its 1.5 s wait was over"
kill -9 "$PS"

# 3. Neither the chief nor the ps: the checks themselves fail; the error gives the last one.
read -r P0 P1 P2 <<< "$(free_ports 3)"
H="--ps_hosts 127.0.0.1:$P0 --worker_hosts 127.0.0.1:$P1,127.0.0.1:$P2"
rc=0
timeout 30 "$BIN/mnist_replica" --job_name worker --task_index 1 $H --train_steps 100 --quiet \
    --wait_for_chief_ms 1500 --rpc_timeout_ms 500 > "$TMP/w1c" 2>&1 || rc=$?
tail -1 "$TMP/w1c"
[ "$rc" -eq 1 ] || { cat "$TMP/w1c"; fail "expected exit 1 without a ps, got $rc"; }
grep -q "DEADLINE_EXCEEDED: waited 1500 ms for the chief to initialize variables: hid_w" "$TMP/w1c" ||
    fail "no DEADLINE_EXCEEDED naming the variables"
grep -q "the last check failed: UNAVAILABLE" "$TMP/w1c" || fail "the error does not give the failed check"
grep -q "/job:ps/replica:0/task:0" "$TMP/w1c" || fail "the error does not name the ps"
echo "PASS nonchief_wait"
