#!/usr/bin/env bash
# CurveZMQ covers clients: standing servers started with the cluster keys serve a client that
# holds them (from the environment, as dg-server takes them); a client without them gets no
# session, and one with other keys neither, each told UNAUTHENTICATED within 5 s (its handshake
# monitor; its wait for the master is 30 s) instead of hanging or waiting it out.
source "$(dirname "$0")/common.bash"
read -r P0 P1 P2 <<< "$(free_ports 3)"
SPEC="master|127.0.0.1:$P0;worker|127.0.0.1:$P1;worker_|127.0.0.1:$P2"
M="dg://127.0.0.1:$P0"
keys() { "$BIN/dg-server" --gen_curve_keys | sed 's/^[^=]*=//' | tr '\n' ' '; }
read -r DG_CURVE_PUBLIC_KEY DG_CURVE_SECRET_KEY <<< "$(keys)"
export DG_CURVE_PUBLIC_KEY DG_CURVE_SECRET_KEY
start_servers "$SPEC" master:0 worker:0 worker_:0
"$BIN/in_graph_replication" --master "$M" --train_steps 40 > "$TMP/c1" 2>&1 || { cat "$TMP/c1"; fail "the client with the keys failed"; }
check_curves "$TMP/c1" "client with the cluster keys"
rc=0
t0=$SECONDS
env -u DG_CURVE_PUBLIC_KEY -u DG_CURVE_SECRET_KEY "$BIN/in_graph_replication" --master "$M" --train_steps 40 \
    --wait_for_tasks_ms 30000 > "$TMP/c2" 2>&1 || rc=$?
tail -1 "$TMP/c2"
[ "$rc" -ne 0 ] || fail "a client without the keys trained"
grep -q "UNAUTHENTICATED.*this process has none" "$TMP/c2" || fail "the keyless client was not told it lacks the keys"
[ $((SECONDS - t0)) -le 5 ] || fail "the keyless client took $((SECONDS - t0)) s to give up"
read -r OTHER_PUB OTHER_SEC <<< "$(keys)"
rc=0
t0=$SECONDS
DG_CURVE_PUBLIC_KEY=$OTHER_PUB DG_CURVE_SECRET_KEY=$OTHER_SEC "$BIN/in_graph_replication" --master "$M" \
    --train_steps 40 --wait_for_tasks_ms 30000 > "$TMP/c3" 2>&1 || rc=$?
tail -1 "$TMP/c3"
[ "$rc" -ne 0 ] || fail "a client with other keys trained"
grep -q "UNAUTHENTICATED.*refused" "$TMP/c3" || fail "the client with other keys was not told it was refused"
[ $((SECONDS - t0)) -le 5 ] || fail "the client with other keys took $((SECONDS - t0)) s to give up"
echo "PASS standing_curve"
