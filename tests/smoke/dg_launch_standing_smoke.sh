#!/usr/bin/env bash
# dg-launch --mode standing: standing dg-server tasks (1 ps + 2 workers) and one client, the
# in-graph replication example with the cluster flags dg-launch appends; the client's curves
# match (checked on the numbers it prints: check_curves), dg-launch exits 0 when it is done
# and stops the servers; a failing client fails it. --mode coordinator gives the program
# TF_CONFIG's chief task beside the standing servers and appends nothing.
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
# --mode coordinator: the same standing servers, and the program once, as the chief of TF_CONFIG
# (TensorFlow 2's parameter-server layout), with nothing appended to its arguments.
cat > "$tmp/chief.sh" <<'EOS'
#!/bin/sh
echo "args: $*"
echo "tf_config: $TF_CONFIG"
EOS
chmod +x "$tmp/chief.sh"
"$BIN/dg-launch" --ps 1 --workers 2 --mode coordinator --timeout 60 -- "$tmp/chief.sh" one > "$tmp/coord" 2>&1 ||
    { cat "$tmp/coord"; fail "dg-launch --mode coordinator failed"; }
grep -qx "\[client0\] args: one" "$tmp/coord" || { cat "$tmp/coord"; fail "coordinator mode appended arguments"; }
sed -n 's/^\[client0\] tf_config: //p' "$tmp/coord" > "$tmp/tf_config"
spec=$(sed -n 's/^dg-launch: cluster \(.*\); coordinator mode$/\1/p' "$tmp/coord")
python3 - "$tmp/tf_config" "$spec" <<'EOS' || { cat "$tmp/coord"; fail "coordinator mode: TF_CONFIG is not the chief's"; }
import json, sys
c = json.load(open(sys.argv[1]))
servers = json.loads(sys.argv[2])
assert c["task"] == {"type": "chief", "index": 0}, c["task"]
assert sorted(c["cluster"]) == ["chief", "ps", "worker"], c["cluster"]
assert len(c["cluster"]["chief"]) == 1
assert c["cluster"]["ps"] == servers["ps"] and c["cluster"]["worker"] == servers["worker"], (c, servers)
assert c["cluster"]["chief"][0] not in servers["ps"] + servers["worker"]
EOS
rc=0
"$BIN/dg-launch" --workers 2 --mode coordinator -- "$tmp/chief.sh" > "$tmp/bad" 2>&1 || rc=$?
[ "$rc" = 2 ] && grep -q "mode coordinator needs --ps 1 or more" "$tmp/bad" || { cat "$tmp/bad"; fail "no ps refused"; }
echo "PASS dg_launch_standing_smoke"
