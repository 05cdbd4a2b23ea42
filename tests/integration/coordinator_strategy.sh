#!/usr/bin/env bash
# The ps_coordinator distribution (distgraph/distribute.h) as TensorFlow 2's parameter-server
# training runs: standing ps and worker tasks, one coordinator process (examples/strategies.c,
# job "chief") handing each step to a free worker. Worker 1 is SIGKILLed after 1500 of 30000
# steps and started again on its port once the coordinator has noticed: its step goes to the
# others, the worker takes work again when it is back, every step runs (none dropped; the global
# step ends at 30000, or past it by a given-back step whose update had reached the ps already:
# at least once, as documented), and the test accuracy reaches the bar of the asynchronous
# parameter server (0.82; ps_coordinator.sh). Then the coordinator refuses, within seconds and
# naming the fix, a cluster whose every worker is down.
source "$(dirname "$0")/common.bash"
read -r P0 P1 P2 P3 <<< "$(free_ports 4)"
SPEC="ps|127.0.0.1:$P0;worker|127.0.0.1:$P1,127.0.0.1:$P2,127.0.0.1:$P3"
start_servers "$SPEC" ps:0 worker:0 worker:1 worker:2
# Noticing the kill takes the session keepalive's ~5 s and coming back up to the 5 s backoff
# between pings: the run must outlast both. 12000 steps once did (12 s); with the sparse
# products of the first layer they took 8.3 s, and the worker had no time to come back.
STEPS=30000
FLAGS=(--strategy ps_coordinator --job_name chief --ps_hosts 127.0.0.1:$P0
       --worker_hosts 127.0.0.1:$P1,127.0.0.1:$P2,127.0.0.1:$P3)
"$BIN/strategies" "${FLAGS[@]}" --train_steps $STEPS --learning_rate 0.005 --log_every 250 > "$TMP/c" 2>&1 & C=$!
PIDS+=($C)
for _ in $(seq 1200); do grep -q "^coordinator: local step \(1[5-9]\|[2-5]\)[0-9][0-9][0-9] " "$TMP/c" && break; sleep 0.05; done
grep -q "^coordinator: local step \(1[5-9]\|[2-5]\)[0-9][0-9][0-9] " "$TMP/c" || { cat "$TMP/c"; fail "the coordinator never got to step 1500"; }
kill -9 "${SERVER_PID[worker:1]}"
echo "killed worker 1 at $(grep "^coordinator: local step" "$TMP/c" | tail -1)"
for _ in $(seq 400); do grep -q "worker 1 .* failed" "$TMP/c" && break; sleep 0.05; done
grep "worker 1 .* failed" "$TMP/c" || { cat "$TMP/c"; fail "the coordinator did not notice worker 1 die"; }
start_servers "$SPEC" worker:1
wait "$C" || { cat "$TMP/c"; fail "the coordinator failed"; }
grep -E "is back|steps ran|test accuracy" "$TMP/c"
grep -q "worker 1 (dg://127.0.0.1:$P2) is back" "$TMP/c" || { cat "$TMP/c"; fail "worker 1 did not come back"; }
grep -q "worker 1 [0-9]* (failed 1 time, [1-9][0-9]* since it came back)" "$TMP/c" || fail "worker 1 ran no step once back"
grep -q "^distgraph: coordinator: $STEPS steps ran: .* [1-9][0-9]* given back after a worker failed, 0 dropped" "$TMP/c" ||
    fail "not every step ran, or none was given back"
# Every step ran at least once: the global step is STEPS, or past it by a step given back after
# its update had already reached the ps (at least once, as TensorFlow's coordinator).
back=$(sed -n 's/^distgraph: coordinator: .*; \([0-9]*\) given back after a worker failed.*/\1/p' "$TMP/c")
gs=$(sed -n "s/^coordinator: $STEPS local steps in .*, global step \([0-9]*\);.*/\1/p" "$TMP/c")
check_number "steps given back" "$back"
check_number "the global step" "$gs"
check_ge "the global step" "$gs" "$STEPS"
check_le "the global step" "$gs" $((STEPS + back))
acc=$(sed -n 's/^coordinator: .* test accuracy \([0-9.]*\), cross entropy .*/\1/p' "$TMP/c")
check_ge "test accuracy" "$acc" 0.82
# No worker answers: the coordinator gives up after --peer_timeout_ms and says why.
for t in worker:0 worker:1 worker:2; do kill -9 "${SERVER_PID[$t]}" 2> /dev/null || true; done
sleep 0.2
start=$(date +%s)
if "$BIN/strategies" "${FLAGS[@]}" --train_steps 100 --peer_timeout_ms 2000 > "$TMP/none" 2>&1; then
    cat "$TMP/none"
    fail "the coordinator trained with no worker up"
fi
took=$(($(date +%s) - start))
grep "UNAVAILABLE" "$TMP/none" | tail -1
grep -q "UNAVAILABLE: .*none of the 3 workers has answered for [0-9]* ms (the first at dg://127.0.0.1:$P1; .*start the worker tasks" "$TMP/none" ||
    { cat "$TMP/none"; fail "no message naming the workers and the fix"; }
[ "$took" -le 20 ] || fail "giving up took $took s"
echo "PASS coordinator_strategy"
