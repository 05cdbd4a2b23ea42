# Helpers for the integration tests (sourced). Real processes on 127.0.0.1.
set -euo pipefail
BIN="${DG_BIN_DIR:?DG_BIN_DIR must point at build/bin}"
TMP=$(mktemp -d)
PIDS=()
cleanup() {
    for p in "${PIDS[@]:-}"; do [ -n "$p" ] && kill -9 "$p" 2>/dev/null || true; done
    rm -rf "$TMP"
}
trap cleanup EXIT
# free_ports N: N free TCP ports of 127.0.0.1 on one line, below the kernel's ephemeral range
# where it leaves room: an ephemeral port can be taken meanwhile by any outgoing connection
# (a ZeroMQ socket reconnecting to a task that restarts on that port can even connect to itself),
# so a task restarted on its port could find it taken.
free_ports() {
    python3 - "$1" <<'PY'
import random, socket, sys
n, lo, hi = int(sys.argv[1]), 15000, 32767
try:
    with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
        hi = min(hi, int(f.read().split()[0]) - 1)
except (OSError, ValueError, IndexError):
    pass
socks, rng = [], random.SystemRandom()
for _ in range(n):
    for attempt in range(200 if hi - lo > 1000 else 0):
        s = socket.socket()
        try:
            s.bind(("127.0.0.1", rng.randrange(lo, hi)))
            break
        except OSError:
            s.close()
    else:
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
    socks.append(s)
print(" ".join(str(s.getsockname()[1]) for s in socks))
PY
}
fail() { echo "FAIL: $*"; exit 1; }
# The newest global step a worker's log reports ("... (global step: 241)"), or nothing.
last_step() { sed -n 's/.*(global step: \([0-9]*\)).*/\1/p' "$1" | tail -1; }
# Waits up to $3 twentieths of a second until log $1 reports global step $2 or more; prints
# the newest step seen (empty when none).
wait_step() {
    local s=""
    for _ in $(seq "$3"); do s=$(last_step "$1"); [ -n "$s" ] && [ "$s" -ge "$2" ] && break; sleep 0.05; done
    last_step "$1"
}
# Once log $1 reports global step $2 or more (waiting up to $3 twentieths of a second, and
# before $STEPS), SIGKILLs the ps ($PS) and, a second later, starts it again with the test's
# start_ps. Sets killed_at to the step seen.
kill_and_restart_ps() {
    killed_at=$(wait_step "$1" "$2" "$3")
    [ -n "$killed_at" ] && [ "$killed_at" -ge "$2" ] || { cat "$1"; fail "the chief never reached global step $2"; }
    [ "$killed_at" -lt "$STEPS" ] || fail "training ended before the ps could be killed"
    kill -9 "$PS"
    wait "$PS" 2>/dev/null || true
    echo "killed the ps at global step $killed_at"
    sleep 1
    start_ps
}
# start_servers SPEC JOB:TASK...: starts a standing dg-server per JOB:TASK of cluster SPEC
# (extra dg-server flags in $SERVER_FLAGS); each one's pid lands in SERVER_PID[JOB:TASK], its
# log in $TMP/server_JOB_TASK.
declare -A SERVER_PID
start_servers() {
    local spec=$1 t
    shift
    for t in "$@"; do
        # shellcheck disable=SC2086
        "$BIN/dg-server" --cluster_spec "$spec" --job_name "${t%%:*}" --task_index "${t##*:}" ${SERVER_FLAGS:-} \
            > "$TMP/server_${t%%:*}_${t##*:}" 2>&1 &
        SERVER_PID[$t]=$!
        PIDS+=($!)
    done
}
# task_stat TARGET KEY: one counter of a running task (dg-inspect server).
task_stat() { "$BIN/dg-inspect" server "$1" | awk -v k="$2" '$1 == k { print $2 }'; }
# check_loss_table LOG WHAT COL NF: in LOG's rows of NF fields whose field COL-1 is a step
# number, the two losses in fields COL and COL+1 (distributed, single-process) are finite
# numbers, and the distributed loss of the last row is below that of the first.
check_loss_table() {
    awk -v what="$2" -v col="$3" -v nf="$4" '
        NF == nf && $(col - 1) ~ /^[0-9]+$/ {
            for (i = col; i <= col + 1; i++)
                if ($i !~ /^-?[0-9]+\.[0-9]+$/) { print "FAIL: " what ": loss \"" $i "\" at step " $(col - 1) " is not finite"; bad = 1 }
            if (n == 0) first = $col; last = $col; n++
        }
        END {
            if (bad) exit 1
            if (n < 2) { print "FAIL: " what ": no loss table"; exit 1 }
            if (!(last + 0 < first + 0)) { print "FAIL: " what ": the loss did not fall (" first " -> " last ")"; exit 1 }
            printf "%s: loss %s -> %s over %d rows, all finite\n", what, first, last, n
        }' "$1"
}
# Checks an in_graph_replication log: the client's own verdict, and independently the losses.
check_curves() {
    grep -q "^curves match: yes" "$1" || { cat "$1"; fail "$2: the curves do not match"; }
    check_loss_table "$1" "$2" 2 3
}
