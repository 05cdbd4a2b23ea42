#!/usr/bin/env bash
# A worker task killed under a remote session: the client's step fails with UNAVAILABLE (or
# ABORTED, when the task had finished its part of the step before it died) naming the task,
# within seconds, instead of hanging; the master keeps serving.
source "$(dirname "$0")/common.bash"
read -r P0 P1 P2 <<< "$(free_ports 3)"
SPEC="master|127.0.0.1:$P0;worker|127.0.0.1:$P1;worker_|127.0.0.1:$P2"
M="dg://127.0.0.1:$P0"
start_servers "$SPEC" master:0 worker:0 worker_:0
"$BIN/in_graph_replication" --master "$M" --train_steps 100000000 --log_every 50 > "$TMP/c1" 2>&1 & C1=$!
PIDS+=($C1)
for _ in $(seq 200); do [ "$(grep -c '^ *[0-9]' "$TMP/c1")" -ge 3 ] && break; sleep 0.05; done
[ "$(grep -c '^ *[0-9]' "$TMP/c1")" -ge 3 ] || { cat "$TMP/c1"; fail "the client never trained"; }
kill -9 "${SERVER_PID[worker_:0]}"
start=$(date +%s.%N)
timeout 30 tail --pid="$C1" -f /dev/null || {
    # A hang: what the client and the master last said tells where it waits.
    for l in c1 server_master_0 server_worker_0; do echo "--- $l"; tail -30 "$TMP/$l"; done
    stacks "$C1" "the client"
    stacks "${SERVER_PID[master:0]}" "the master task"
    fail "the client still runs 30 s after a worker task died"
}
rc=0
wait "$C1" || rc=$?
end=$(date +%s.%N)
tail -1 "$TMP/c1"
[ "$rc" -ne 0 ] || fail "the client exited 0 although a worker task is gone"
# UNAVAILABLE when the client's step was waiting on the dead task; ABORTED when the task had
# already done its part and the step was aborted as it stopped answering (its values may never
# arrive). Either names the task.
grep -q "UNAVAILABLE" "$TMP/c1" || grep -q "ABORTED: .*stopped answering" "$TMP/c1" \
    || fail "neither UNAVAILABLE nor an abort for a task that stopped answering in the client's error"
grep -q "/job:worker_/replica:0/task:0" "$TMP/c1" || fail "the error does not name the dead task"
awk -v a="$start" -v b="$end" 'BEGIN { printf "the client failed %.2f s after the worker task died\n", b - a }'
s=$(task_stat "$M" master_sessions)
[ "$s" = 0 ] || fail "the master still holds $s session(s)"
echo "PASS standing_worker_killed"
