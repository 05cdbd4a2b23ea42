#!/usr/bin/env bash
# dg-server basics: --help; bad inputs exit 2 with a message naming the problem; a server on a
# free port stops with exit 0 on SIGTERM (and SIGINT); a second server on the same port exits 1
# naming the address; TF_CONFIG alone starts the right task; --gen_curve_keys prints a key pair
# that a server accepts.
# No check bounds how long a working server takes to start or stop (the test runs beside
# others, maybe under valgrind): the stop time is printed, and a server that never stops, never
# serves or never exits is caught by the hang guard below. bench/stop_latency_bench.sh
# measures how fast a server stops.
set -euo pipefail
server="${DG_BIN_DIR:?}/dg-server"
[ -x "$server" ] || { echo "no $server"; exit 1; }
unset TF_CONFIG DG_CURVE_PUBLIC_KEY DG_CURVE_SECRET_KEY
tmp=$(mktemp -d)
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null || true; done
    rm -rf "$tmp"
}
trap cleanup EXIT
# forget PID: a process that was waited for leaves the list (its pid may be reused).
forget() {
    local keep=() p
    for p in "${pids[@]}"; do [ "$p" = "$1" ] || keep+=("$p"); done
    pids=("${keep[@]}")
}
fail() { echo "FAIL: $*"; exit 1; }
now_ms() { echo $(( $(date +%s%N) / 1000000 )); }
# A deadlock guard, not a performance claim: how long the test waits for anything that must
# happen (a server serving, stopping, a command exiting) before it fails.
HANG_GUARD=60
guard() { timeout -s KILL "$HANG_GUARD" "$@"; }
# A TCP port of 127.0.0.1 that is free now (checked when python3 is there; start_serving
# retries anyway), below the kernel's ephemeral range where any outgoing connection may take a
# port meanwhile, as tests/testutil.c's dg_test_free_port.
eph_lo=$(awk '{print $1}' /proc/sys/net/ipv4/ip_local_port_range 2>/dev/null || true)
[[ "$eph_lo" =~ ^[0-9]+$ ]] && [ "$eph_lo" -gt 16000 ] && [ "$eph_lo" -le 32768 ] || eph_lo=32768
free_port() {
    local p
    for _ in $(seq 100); do
        p=$(( 15000 + RANDOM % (eph_lo - 15000) ))
        command -v python3 > /dev/null || { echo "$p"; return; }
        python3 -c 'import socket, sys; socket.socket().bind(("127.0.0.1", int(sys.argv[1])))' "$p" 2>/dev/null \
            && { echo "$p"; return; }
    done
    fail "no free port below $eph_lo in 100 tries"
}

# expect_bad WANT_RC PATTERN [ENV=VALUE...] -- ARGS...: runs dg-server, checks the exit status
# and that stderr is one line matching PATTERN (a grep -E regex).
expect_bad() {
    local want=$1 pattern=$2
    shift 2
    local envs=()
    while [ "$1" != "--" ]; do envs+=("$1"); shift; done
    shift
    set +e
    guard env "${envs[@]}" "$server" "$@" > "$tmp/out" 2> "$tmp/err"
    local rc=$?
    set -e
    [ "$rc" -eq "$want" ] || { cat "$tmp/err"; fail "dg-server $*: exit $rc, want $want"; }
    [ "$(wc -l < "$tmp/err")" -eq 1 ] || { cat "$tmp/err"; fail "dg-server $*: want one error line"; }
    grep -qE "$pattern" "$tmp/err" || { cat "$tmp/err"; fail "dg-server $*: message does not match /$pattern/"; }
    echo "ok: exit $want: $(cat "$tmp/err")"
}

# Waits for "serving at" in a log file: returns 0 then, 1 when the process exited first (the
# log names why), and fails after HANG_GUARD s.
wait_serving() {
    local pid=$1 log=$2
    for ((i = 0; i < HANG_GUARD * 40; i++)); do
        grep -qs "serving at" "$log" && return 0
        kill -0 "$pid" 2>/dev/null || return 1
        sleep 0.025
    done
    cat "$log"
    fail "server did not report serving within $HANG_GUARD s (hang guard)"
}

# start_serving NAME FN: picks a free port into $port, runs FN in the background (its output
# in $tmp/NAME.log; its pid in $spid) and waits until it serves. A port another process took
# meanwhile (the server exits saying it cannot bind) costs a retry on a fresh port.
start_serving() {
    local name=$1 fn=$2
    for _ in 1 2 3 4 5; do
        port=$(free_port)
        "$fn" > "$tmp/$name.log" 2>&1 &
        spid=$!
        pids+=("$spid")
        wait_serving "$spid" "$tmp/$name.log" && return 0
        wait "$spid" || true
        forget "$spid"
        grep -q "cannot bind" "$tmp/$name.log" || { cat "$tmp/$name.log"; fail "$name: server exited before serving"; }
        echo "note: port $port was taken meanwhile; another"
    done
    cat "$tmp/$name.log"
    fail "$name: 5 ports in a row were taken"
}

# Sends SIG to pid and checks it exits 0 (failing after HANG_GUARD s, the hang guard).
stop_clean() {
    local pid=$1 sig=$2
    local t0
    t0=$(now_ms)
    kill "-$sig" "$pid"
    for ((i = 0; i < HANG_GUARD * 100; i++)); do kill -0 "$pid" 2>/dev/null || break; sleep 0.01; done
    local dt=$(( $(now_ms) - t0 ))
    if kill -0 "$pid" 2>/dev/null; then
        kill -9 "$pid" 2>/dev/null || true   # fail, but do not hang on a server stuck in shutdown
        fail "server still running $dt ms after SIG$sig (hang guard)"
    fi
    set +e
    wait "$pid"
    local rc=$?
    set -e
    forget "$pid"
    [ "$rc" -eq 0 ] || fail "server exited $rc on SIG$sig, want 0"
    echo "ok: SIG$sig stops the server with exit 0 (in $dt ms)"
}

guard "$server" --help > "$tmp/out" || fail "--help exits $?"
grep -q -- "--cluster_spec" "$tmp/out" && grep -q "TF_CONFIG" "$tmp/out" || fail "--help text"
echo "ok: --help"

spec='ps|127.0.0.1:2222,127.0.0.1:2223;worker|127.0.0.1:2224'
expect_bad 2 'missing --job_name' -- --cluster_spec "$spec"
expect_bad 2 'task index 2 is out of range for job "ps".*0\.\.1' -- --cluster_spec "$spec" --job_name ps --task_index 2
expect_bad 2 'task index 1 is out of range for job "worker"' -- --ps_hosts 127.0.0.1:1 --worker_hosts 127.0.0.1:2 --job_name worker --task_index 1
expect_bad 2 'job "chief" is not in the cluster.*ps, worker' -- --cluster_spec "$spec" --job_name chief
expect_bad 2 'cluster_spec.*ps127\.0\.0\.1:1' -- --cluster_spec 'ps127.0.0.1:1' --job_name ps
expect_bad 2 'cluster_spec' -- --cluster_spec 'ps|127.0.0.1:99999' --job_name ps
expect_bad 2 'task_index must be a non-negative integer, got "-1"' -- --cluster_spec "$spec" --job_name ps --task_index -1
expect_bad 2 'unknown flag "--bogus"' -- --bogus 1
expect_bad 2 'unexpected argument "stray"' -- stray
expect_bad 2 'flag --job_name needs a value' -- --cluster_spec "$spec" --job_name
expect_bad 2 'rpc_timeout_ms must be a positive integer' -- --cluster_spec "$spec" --job_name ps --rpc_timeout_ms 0
expect_bad 2 'busy_poll_us must be an integer from 0 .off. to 1000000, got "150us"' -- --cluster_spec "$spec" --job_name ps --busy_poll_us 150us
expect_bad 2 'no cluster' -- --job_name ps
expect_bad 2 'TF_CONFIG.*"task.index" must be an integer' \
    'TF_CONFIG={"cluster": {"ps": ["127.0.0.1:1"]}, "task": {"type": "ps", "index": "zero"}}' --
expect_bad 2 'TF_CONFIG' 'TF_CONFIG={"cluster": ["127.0.0.1:1"]}' -- --job_name ps
expect_bad 2 'TF_CONFIG has no "task"' 'TF_CONFIG={"cluster": {"ps": ["127.0.0.1:1"]}}' --
expect_bad 2 'keys are not taken from the command line' -- --cluster_spec "$spec" --job_name ps \
    --curve_secret_key 0123456789012345678901234567890123456789
expect_bad 2 'DG_CURVE_PUBLIC_KEY is given without DG_CURVE_SECRET_KEY' \
    DG_CURVE_PUBLIC_KEY=0123456789012345678901234567890123456789 -- --cluster_spec "$spec" --job_name ps
expect_bad 2 'DG_CURVE_SECRET_KEY must be a 40-character Z85 key' \
    DG_CURVE_PUBLIC_KEY=0123456789012345678901234567890123456789 DG_CURVE_SECRET_KEY=short -- --cluster_spec "$spec" --job_name ps

# A server on a free port; a second one on the same port fails to start; SIGTERM stops the first.
run_s1() { exec "$server" --cluster_spec "ps|127.0.0.1:$port" --job_name ps --task_index 0; }
start_serving s1 run_s1
s1=$spid
grep -q "/job:ps/replica:0/task:0" "$tmp/s1.log" || { cat "$tmp/s1.log"; fail "log does not name the task"; }
expect_bad 1 "127\.0\.0\.1:$port" -- --ps_hosts "127.0.0.1:$port" --job_name ps
stop_clean "$s1" TERM

# The task from TF_CONFIG alone; SIGINT stops it too.
run_s2() {
    TF_CONFIG="{\"cluster\": {\"ps\": [\"127.0.0.1:1\"], \"worker\": [\"127.0.0.1:2\", \"127.0.0.1:$port\"]},
                \"task\": {\"type\": \"worker\", \"index\": 1}}" exec "$server"
}
start_serving s2 run_s2
s2=$spid
grep -q "/job:worker/replica:0/task:1.*127\.0\.0\.1:$port" "$tmp/s2.log" || { cat "$tmp/s2.log"; fail "TF_CONFIG task"; }
stop_clean "$s2" INT

# Flags win over TF_CONFIG, even a broken one.
run_s3() { TF_CONFIG='not json' exec "$server" --cluster_spec "worker|127.0.0.1:$port" --job_name worker; }
start_serving s3 run_s3
stop_clean "$spid" TERM

# --gen_curve_keys: two 40-character Z85 keys; a server starts with them from the environment.
guard "$server" --gen_curve_keys > "$tmp/keys" || fail "--gen_curve_keys exits $?"
[ "$(wc -l < "$tmp/keys")" -eq 2 ] || { cat "$tmp/keys"; fail "--gen_curve_keys: want two lines"; }
grep -qE '^DG_CURVE_PUBLIC_KEY=[]0-9A-Za-z.:+=^!/*?&<>()[{}@%$#-]{40}$' "$tmp/keys" && \
    grep -qE '^DG_CURVE_SECRET_KEY=[]0-9A-Za-z.:+=^!/*?&<>()[{}@%$#-]{40}$' "$tmp/keys" && \
    [ "$(sed -n 1p "$tmp/keys" | cut -d= -f2-)" != "$(sed -n 2p "$tmp/keys" | cut -d= -f2-)" ] \
    || { cat "$tmp/keys"; fail "--gen_curve_keys output"; }
echo "ok: --gen_curve_keys"
run_s4() {
    export DG_CURVE_PUBLIC_KEY DG_CURVE_SECRET_KEY
    DG_CURVE_PUBLIC_KEY=$(sed -n 's/^DG_CURVE_PUBLIC_KEY=//p' "$tmp/keys")
    DG_CURVE_SECRET_KEY=$(sed -n 's/^DG_CURVE_SECRET_KEY=//p' "$tmp/keys")
    exec "$server" --cluster_spec "ps|127.0.0.1:$port" --job_name ps
}
start_serving s4 run_s4
stop_clean "$spid" TERM
echo "dg_server smoke: all passed"
