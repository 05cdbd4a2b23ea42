#!/usr/bin/env bash
# A task started as the README starts one (dg-server, default options) against peers that
# misbehave (tests/tools/hostile_peer.c): its memory stays bounded and comes back, and it keeps
# answering. docs/PROTOCOL.md, "Limits", says what bounds each case.
#   chunks:      20 connections x 200 66-byte chunks far into fresh 1 GiB transfers (before the
#                limits: 400 MiB kept for 13.9 KB of chunks), then 200 real first chunks (1 MiB
#                each) of fresh transfers from one connection;
#   pings:       8 PINGs of 100 MiB and 3000 of 60 KiB whose replies are never read (before the
#                limits: 500 MiB held); a 100 MiB frame is over max_message_bytes (32 MiB), so
#                ZeroMQ closes that connection before holding it (the peer's socket reconnects);
#   connections: under a limit of 256 descriptors, 300 raw TCP connections held while a new
#                client PINGs every 100 ms: every PING is answered, and the task does not spin.
# Each scenario prints its JSON line (growth in KiB), so the figures are in the test's log.
source "$(dirname "$0")/common.bash"
LIMIT_KB=$((64 * 1024))   # memory the misbehaving peer may make the task hold
# The peak while a flood is still arriving also holds the messages ZeroMQ has queued and the
# task has not yet taken (1 MiB chunks, 100 MiB PINGs refused at the frame limit): how many
# depends on how far the task falls behind the sender, that is on the machine's load, and the
# product bounds them in messages, not bytes (docs/PROTOCOL.md). Measured under ctest -j2:
# 28-75 MiB for the chunk flood. Before the limits the flood held 400-500 MiB, which this
# bound still catches; what the task holds afterwards is held to LIMIT_KB and AFTER_KB.
PEAK_LIMIT_KB=$((192 * 1024))
ROUNDS=4                  # each abuse is repeated: what stays after must not pile up
# After the peer left, what stays is measured from before the first round: a second after a
# peer leaves the task gives its freed memory back, ZeroMQ's malloc arena included (the
# transport's trim_if_due). Measured: under 1 MiB after all rounds.
AFTER_KB=$((4 * 1024))
# start [ulimit]: a dg-server on a port picked just now (another process may take a port
# picked earlier); sets PORT and SRV. A server that could not bind (the port taken between the
# pick and the bind) is retried on another port; the stat must come from our own process.
start() {
    local try
    for try in 1 2 3 4 5; do
        PORT=$(free_ports 1)
        ( [ -n "${1:-}" ] && ulimit -n "$1"; exec "$BIN/dg-server" --cluster_spec "worker|127.0.0.1:$PORT" \
            --job_name worker --task_index 0 ) > "$TMP/server_$PORT" 2>&1 &
        SRV=$!
        PIDS+=($SRV)
        for _ in $(seq 100); do
            kill -0 "$SRV" 2>/dev/null || break
            task_stat "dg://127.0.0.1:$PORT" connections >/dev/null 2>&1 && kill -0 "$SRV" 2>/dev/null && return 0
            sleep 0.05
        done
        grep -q "Address already in use" "$TMP/server_$PORT" || break
        echo "port $PORT was taken before dg-server could bind it; another"
    done
    cat "$TMP/server_$PORT"
    fail "dg-server on port $PORT did not come up"
}
# json JSON_LINE KEY: one value of a line.
json() { python3 -c 'import json,sys; print(json.loads(sys.argv[1])[sys.argv[2]])' "$1" "$2"; }
# check JSON_LINE KEY MAX: the line's KEY is a number, at most MAX.
check_at_most() {
    local v
    v=$(json "$1" "$2")
    check_number "$2 in $1" "$v"
    [ "$v" -le "$3" ] || fail "$2 = $v, over $3: $1"
}
# left_behind JSON_LINE: sets LEFT to the line's rss_after_kb (a number) less $first, the RSS
# before the first round.
left_behind() {
    local v
    v=$(json "$1" rss_after_kb)
    check_number "rss_after_kb in $1" "$v"
    check_number "rss_before_kb of the first round" "$first"
    LEFT=$((v - first))
}
start
P1=$PORT
first=""
for _ in $(seq $ROUNDS); do
    out=$("$BIN/hostile_peer" --target "127.0.0.1:$P1" --pid "$SRV" --scenario chunks --connections 20) ||
        { echo "$out"; tail -20 "$TMP/server_$P1"; fail "the task stopped answering after the chunk flood"; }
    echo "$out"
    first=${first:-$(json "$out" rss_before_kb)}
    check_at_most "$out" growth_peak_kb "$PEAK_LIMIT_KB"
    left_behind "$out"
    [ "$LEFT" -le "$AFTER_KB" ] || fail "the chunk floods left memory behind: $out"
done
[ "$(task_stat "dg://127.0.0.1:$P1" inflight_bytes)" = 0 ] || fail "chunked transfers still held after the peers left"
refused=$(task_stat "dg://127.0.0.1:$P1" transfers_refused)
abandoned=$(task_stat "dg://127.0.0.1:$P1" transfers_abandoned)
echo "transfers refused $refused, abandoned $abandoned"
[ "$refused" -ge $((ROUNDS * 4000)) ] || fail "expected the 4000 chunks a round that begin nowhere refused, got $refused"
[ "$abandoned" -ge $((ROUNDS * 199)) ] || fail "expected each first chunk to end the transfer before it, got $abandoned abandoned"
grep -q "the peer began another" "$TMP/server_$P1" || fail "no log line for the abandoned transfers"

start
P2=$PORT
first=""
for _ in $(seq $ROUNDS); do
    out=$("$BIN/hostile_peer" --target "127.0.0.1:$P2" --pid "$SRV" --scenario pings) ||
        { echo "$out"; tail -20 "$TMP/server_$P2"; fail "the task stopped answering after the PING flood"; }
    echo "$out"
    first=${first:-$(json "$out" rss_before_kb)}
    check_at_most "$out" growth_peak_kb "$PEAK_LIMIT_KB"
    check_at_most "$out" growth_held_kb "$LIMIT_KB"
    left_behind "$out"
    [ "$LEFT" -le "$AFTER_KB" ] || fail "the PING floods left memory behind: $out"
done
[ "$(task_stat "dg://127.0.0.1:$P2" replies_dropped)" -gt 0 ] || fail "no reply was dropped"

start 256
P3=$PORT
max=$(task_stat "dg://127.0.0.1:$P3" max_connections)
echo "max_connections under ulimit -n 256: $max"
[ "$max" -lt 256 ] || fail "the connection cap ($max) does not fit 256 descriptors"
out=$("$BIN/hostile_peer" --target "127.0.0.1:$P3" --pid "$SRV" --scenario connections --connections 300 \
    --hold_ms 3000) || { echo "$out"; tail -20 "$TMP/server_$P3"; fail "PINGs went unanswered while 300 connections were held"; }
echo "$out"
python3 -c 'import json,sys
d = json.loads(sys.argv[1])
assert d["task_cpu_fraction"] < 0.5, "the task spins: %.0f%% CPU while connections are held" % (100 * d["task_cpu_fraction"])
assert d["closed_by_task"] >= 300 - int(sys.argv[2]), d' "$out" "$max" || fail "connections: $out"
[ "$(task_stat "dg://127.0.0.1:$P3" connections_closed)" -gt 0 ] || fail "no connection was closed"
echo "PASS"
