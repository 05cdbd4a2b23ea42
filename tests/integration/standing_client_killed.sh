#!/usr/bin/env bash
# A client killed with SIGKILL mid-training: the master notices its silence within the lease,
# aborts its step and frees what it registered on every task and its local channel (the
# counters show it), and the servers go on serving: a new client trains afterwards.
source "$(dirname "$0")/common.bash"
read -r P0 P1 P2 <<< "$(free_ports 3)"
SPEC="master|127.0.0.1:$P0;worker|127.0.0.1:$P1;worker_|127.0.0.1:$P2"
M="dg://127.0.0.1:$P0"
SERVER_FLAGS="--client_lease_ms 2000"
start_servers "$SPEC" master:0 worker:0 worker_:0
"$BIN/in_graph_replication" --master "$M" --train_steps 100000000 --log_every 50 > "$TMP/c1" 2>&1 & C1=$!
PIDS+=($C1)
for _ in $(seq 200); do [ "$(grep -c '^ *[0-9]' "$TMP/c1")" -ge 3 ] && break; sleep 0.05; done
[ "$(grep -c '^ *[0-9]' "$TMP/c1")" -ge 3 ] || { cat "$TMP/c1"; fail "the client never trained"; }
g=$(task_stat "dg://127.0.0.1:$P1" registered_graphs)
s=$(task_stat "$M" master_sessions)
ch=$(task_stat "$M" local_channels)
echo "while the client trains: $s session(s) on the master ($ch through a local channel), $g partition(s) on /job:worker"
[ "$s" -ge 1 ] && [ "$g" -ge 1 ] || fail "expected the client's session and partitions, got $s and $g"
[ "$ch" = 1 ] || fail "expected the client on this host to step through a local channel, got $ch"
kill -9 "$C1"
start=$(date +%s.%N)
freed=""
for _ in $(seq 300); do   # a 2 s lease; 30 s of polls only guard against a hang
    s=$(task_stat "$M" master_sessions); g1=$(task_stat "dg://127.0.0.1:$P1" registered_graphs)
    g2=$(task_stat "dg://127.0.0.1:$P2" registered_graphs)
    ch=$(task_stat "$M" local_channels)
    if [ "$s" = 0 ] && [ "$g1" = 0 ] && [ "$g2" = 0 ] && [ "$ch" = 0 ]; then freed=$(date +%s.%N); break; fi
    sleep 0.1
done
[ -n "$freed" ] || fail "300 polls after the client died: $s session(s), $g1 + $g2 partition(s), $ch channel(s) still held"
awk -v a="$start" -v b="$freed" 'BEGIN { printf "the dead client'"'"'s session and partitions were freed %.2f s after SIGKILL\n", b - a }'
grep -q "was silent for" "$TMP/server_master_0" || fail "the master did not log why it closed the session"
"$BIN/in_graph_replication" --master "$M" --train_steps 60 > "$TMP/c2" 2>&1 || { cat "$TMP/c2"; fail "a new client failed"; }
check_curves "$TMP/c2" "new client"
echo "PASS standing_client_killed"
