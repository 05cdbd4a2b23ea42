#!/usr/bin/env bash
# dg-launch --mode standing: standing dg-server tasks (1 ps + 2 workers) and one client, the
# in-graph replication example with the cluster flags dg-launch appends; the client's curves
# match (checked on the numbers it prints: check_curves), dg-launch exits 0 when it is done
# and stops the servers; a failing client fails it.
source "${DG_SOURCE_DIR:?}/tests/integration/common.bash"
tmp=$TMP
"$BIN/dg-launch" --ps 1 --workers 2 --mode standing --timeout 120 -- "$BIN/in_graph_replication" \
    --train_steps 60 > "$tmp/out" 2>&1 || { cat "$tmp/out"; fail "dg-launch --mode standing failed"; }
sed -n 's/^\[client0\] //p' "$tmp/out" > "$tmp/client"
check_curves "$tmp/client" "the client"
grep -q "^\[client0\] 2 replicas (/job:worker/task:0,/job:worker/task:1)" "$tmp/out" || { cat "$tmp/out"; fail "replicas not on the worker tasks"; }
for t in ps0 worker0 worker1; do
    grep -q "^\[$t\] dg-server .*stopping" "$tmp/out" || { cat "$tmp/out"; fail "server $t was not stopped"; }
done
rc=0
"$BIN/dg-launch" --ps 1 --workers 1 --mode standing --timeout 60 -- "$BIN/in_graph_replication" \
    --train_steps 0 > "$tmp/bad" 2>&1 || rc=$?
[ "$rc" = 1 ] || { cat "$tmp/bad"; fail "a client exiting 2 gave dg-launch status $rc, expected 1"; }
grep -q "client 0 exited with status 2" "$tmp/bad" || { cat "$tmp/bad"; fail "the failing client is not named"; }
echo "PASS dg_launch_standing_smoke"
