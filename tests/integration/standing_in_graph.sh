#!/usr/bin/env bash
# In-graph replication from a client process against three standing dg-server tasks (jobs
# master, worker, worker_), as TensorFlow's walk-through: the client starts first and waits for
# the servers; its distributed loss curve matches the single-process one, is finite and falls.
# Then: a second client reads the variables the first trained; two clients train at once on
# the one cluster (each under its own name scope); when they are gone, no task holds any of
# their sessions or registered partitions.
source "$(dirname "$0")/common.bash"
read -r P0 P1 P2 <<< "$(free_ports 3)"
SPEC="master|127.0.0.1:$P0;worker|127.0.0.1:$P1;worker_|127.0.0.1:$P2"
M="dg://127.0.0.1:$P0"
"$BIN/in_graph_replication" --master "$M" --train_steps 150 --log_every 10 > "$TMP/c1" 2> "$TMP/c1.err" & C1=$!
PIDS+=($C1)
sleep 1   # the client waits for servers not up yet
start_servers "$SPEC" worker_:0 worker:0 master:0
wait "$C1" || { cat "$TMP/c1" "$TMP/c1.err"; fail "the first client failed"; }
check_curves "$TMP/c1" "first client"
grep "largest relative loss difference" "$TMP/c1"
sum1=$(sed -n 's/^parameter checksum: //p' "$TMP/c1")
"$BIN/in_graph_replication" --master "$M" --read_variables > "$TMP/c2" 2>&1 || { cat "$TMP/c2"; fail "the reading client failed"; }
sum2=$(sed -n 's/^parameter checksum: //p' "$TMP/c2")
[ -n "$sum1" ] && [ "$sum1" = "$sum2" ] || fail "a second client read checksum \"$sum2\", the first trained \"$sum1\""
echo "second client read the trained variables (checksum $sum2)"
"$BIN/in_graph_replication" --master "$M" --train_steps 150 --scope a --seed 2 > "$TMP/a" 2>&1 & A=$!
"$BIN/in_graph_replication" --master "$M" --train_steps 150 --scope b --seed 3 > "$TMP/b" 2>&1 & B=$!
PIDS+=($A $B)
wait "$A" || { cat "$TMP/a"; fail "client a of two at once failed"; }
wait "$B" || { cat "$TMP/b"; fail "client b of two at once failed"; }
check_curves "$TMP/a" "client a"
check_curves "$TMP/b" "client b"
for p in $P0 $P1 $P2; do
    g=$(task_stat "dg://127.0.0.1:$p" registered_graphs)
    s=$(task_stat "dg://127.0.0.1:$p" master_sessions)
    [ "$g" = 0 ] && [ "$s" = 0 ] || fail "task at port $p still holds $g partitions and $s sessions after its clients closed"
done
echo "PASS standing_in_graph"
