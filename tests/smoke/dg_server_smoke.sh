#!/usr/bin/env bash
# dg-server basics: --help; bad inputs exit 2 with a message naming the problem; a server on a
# free port stops with exit 0 on SIGTERM (and SIGINT) within 2 s; a second server on the same
# port exits 1 naming the address; TF_CONFIG alone starts the right task; --gen_curve_keys
# prints a key pair that a server accepts.
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
fail() { echo "FAIL: $*"; exit 1; }
now_ms() { echo $(( $(date +%s%N) / 1000000 )); }
free_port() {
    python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])' 2>/dev/null \
        || echo $(( 20000 + RANDOM % 30000 ))
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
    env "${envs[@]}" "$server" "$@" > "$tmp/out" 2> "$tmp/err"
    local rc=$?
    set -e
    [ "$rc" -eq "$want" ] || { cat "$tmp/err"; fail "dg-server $*: exit $rc, want $want"; }
    [ "$(wc -l < "$tmp/err")" -eq 1 ] || { cat "$tmp/err"; fail "dg-server $*: want one error line"; }
    grep -qE "$pattern" "$tmp/err" || { cat "$tmp/err"; fail "dg-server $*: message does not match /$pattern/"; }
    echo "ok: exit $want: $(cat "$tmp/err")"
}

# Waits for "serving at" in a log file; fails if the process exits first.
wait_serving() {
    local pid=$1 log=$2
    for _ in $(seq 200); do
        grep -qs "serving at" "$log" && return 0
        kill -0 "$pid" 2>/dev/null || { cat "$log"; fail "server exited before serving"; }
        sleep 0.025
    done
    cat "$log"
    fail "server did not report serving within 5 s"
}

# Sends SIG to pid and checks it exits 0 within 2 s.
stop_clean() {
    local pid=$1 sig=$2
    local t0
    t0=$(now_ms)
    kill "-$sig" "$pid"
    for _ in $(seq 200); do kill -0 "$pid" 2>/dev/null || break; sleep 0.01; done
    local dt=$(( $(now_ms) - t0 ))
    if kill -0 "$pid" 2>/dev/null; then
        kill -9 "$pid" 2>/dev/null || true   # fail, but do not hang on a server stuck in shutdown
        fail "server still running $dt ms after SIG$sig"
    fi
    set +e
    wait "$pid"
    local rc=$?
    set -e
    [ "$rc" -eq 0 ] || fail "server exited $rc on SIG$sig, want 0"
    [ "$dt" -lt 2000 ] || fail "server took $dt ms to stop on SIG$sig"
    echo "ok: SIG$sig stops the server with exit 0 in $dt ms"
}

"$server" --help > "$tmp/out" || fail "--help exits $?"
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
port=$(free_port)
"$server" --cluster_spec "ps|127.0.0.1:$port" --job_name ps --task_index 0 > "$tmp/s1.log" 2>&1 &
s1=$!
pids+=("$s1")
wait_serving "$s1" "$tmp/s1.log"
grep -q "/job:ps/replica:0/task:0" "$tmp/s1.log" || { cat "$tmp/s1.log"; fail "log does not name the task"; }
expect_bad 1 "127\.0\.0\.1:$port" -- --ps_hosts "127.0.0.1:$port" --job_name ps
stop_clean "$s1" TERM

# The task from TF_CONFIG alone; SIGINT stops it too.
port=$(free_port)
TF_CONFIG="{\"cluster\": {\"ps\": [\"127.0.0.1:1\"], \"worker\": [\"127.0.0.1:2\", \"127.0.0.1:$port\"]},
            \"task\": {\"type\": \"worker\", \"index\": 1}}" "$server" > "$tmp/s2.log" 2>&1 &
s2=$!
pids+=("$s2")
wait_serving "$s2" "$tmp/s2.log"
grep -q "/job:worker/replica:0/task:1.*127\.0\.0\.1:$port" "$tmp/s2.log" || { cat "$tmp/s2.log"; fail "TF_CONFIG task"; }
stop_clean "$s2" INT

# Flags win over TF_CONFIG, even a broken one.
port=$(free_port)
TF_CONFIG='not json' "$server" --cluster_spec "worker|127.0.0.1:$port" --job_name worker > "$tmp/s3.log" 2>&1 &
s3=$!
pids+=("$s3")
wait_serving "$s3" "$tmp/s3.log"
stop_clean "$s3" TERM

# --gen_curve_keys: two 40-character Z85 keys; a server starts with them from the environment.
"$server" --gen_curve_keys > "$tmp/keys" || fail "--gen_curve_keys exits $?"
[ "$(wc -l < "$tmp/keys")" -eq 2 ] || { cat "$tmp/keys"; fail "--gen_curve_keys: want two lines"; }
grep -qE '^DG_CURVE_PUBLIC_KEY=[]0-9A-Za-z.:+=^!/*?&<>()[{}@%$#-]{40}$' "$tmp/keys" && \
    grep -qE '^DG_CURVE_SECRET_KEY=[]0-9A-Za-z.:+=^!/*?&<>()[{}@%$#-]{40}$' "$tmp/keys" && \
    [ "$(sed -n 1p "$tmp/keys" | cut -d= -f2-)" != "$(sed -n 2p "$tmp/keys" | cut -d= -f2-)" ] \
    || { cat "$tmp/keys"; fail "--gen_curve_keys output"; }
echo "ok: --gen_curve_keys"
port=$(free_port)
(
    export DG_CURVE_PUBLIC_KEY DG_CURVE_SECRET_KEY
    DG_CURVE_PUBLIC_KEY=$(sed -n 's/^DG_CURVE_PUBLIC_KEY=//p' "$tmp/keys")
    DG_CURVE_SECRET_KEY=$(sed -n 's/^DG_CURVE_SECRET_KEY=//p' "$tmp/keys")
    exec "$server" --cluster_spec "ps|127.0.0.1:$port" --job_name ps
) > "$tmp/s4.log" 2>&1 &
s4=$!
pids+=("$s4")
wait_serving "$s4" "$tmp/s4.log"
stop_clean "$s4" TERM
echo "dg_server smoke: all passed"
