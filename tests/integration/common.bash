# Helpers for the integration tests (sourced). Real processes on 127.0.0.1.
set -euo pipefail
BIN="${DG_BIN_DIR:?DG_BIN_DIR must point at build/bin}"
TMP=$(mktemp -d)
PIDS=()
cleanup() {
    for p in "${PIDS[@]:-}"; do [ -n "$p" ] && kill -9 "$p" 2>/dev/null || true; done
    # DG_TEST_KEEP=DIR keeps every process's log there, for a failure seen once.
    [ -n "${DG_TEST_KEEP:-}" ] && cp -r "$TMP" "$DG_TEST_KEEP/$(basename "$0" .sh).$$" 2>/dev/null
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
# wait_ok DEADLINE NAME PID LOG...: waits for PID until SECONDS reaches DEADLINE. Still running
# then is a hang (its threads' stacks are printed); a non-zero exit fails with the logs' tails.
wait_ok() {
    local deadline=$1 name=$2 pid=$3
    shift 3
    while kill -0 "$pid" 2>/dev/null && [ $SECONDS -lt "$deadline" ]; do sleep 0.2; done
    if kill -0 "$pid" 2>/dev/null; then
        stacks "$pid" "$name"
        fail "$name still runs after the deadline (a hang)"
    fi
    wait "$pid" || { tail -n 20 "$@"; fail "$name exited with an error"; }
}
# stacks PID NAME: every thread's stack of a process that seems to hang (gdb, from scripts/setup.sh),
# so that a rare hang seen once says where it waited.
stacks() {
    command -v gdb >/dev/null || { echo "(no gdb: no stacks of $2)"; return 0; }
    echo "--- stacks of $2 (pid $1)"
    timeout 60 gdb -batch -p "$1" -ex "thread apply all bt" 2>&1 | grep -E '^(Thread|#)' | head -200 || true
}
# is_number X: X is a finite decimal number ("12", "-0.5", "1.5e-07"): not empty, not "nan" or
# "inf", not "1.2.3" and not so large it overflows. Check it before comparing X in awk: awk
# compares anything that is not a number as a string ("nan" >= 0.82 is true in mawk).
is_number() {
    [[ $1 =~ ^[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?$ ]] &&
        awk -v x="$1" 'BEGIN { v = x + 0; exit !(v <= 1.7976931348623157e308 && v >= -1.7976931348623157e308) }'
}
# check_number WHAT X: fails the test unless X is a finite number.
check_number() { is_number "$2" || fail "$1 is not a finite number: \"$2\""; }
# check_ge WHAT X MIN and check_le WHAT X MAX: X is a finite number, and X >= MIN
# (X <= MAX).
check_ge() {
    check_number "$1" "$2"
    awk -v x="$2" -v m="$3" 'BEGIN { exit !(x + 0 >= m + 0) }' || fail "$1 $2 < $3"
}
check_le() {
    check_number "$1" "$2"
    awk -v x="$2" -v m="$3" 'BEGIN { exit !(x + 0 <= m + 0) }' || fail "$1 $2 > $3"
}
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
# check_replica_worker LOG W STEPS MIN_ACC: in LOG, dg-launch's output of a replica program
# (mnist_replica, cnn_replica), worker W's own lines (prefixed "[workerW] ", kept in
# $TMP/workerW) end its training at a global step in STEPS..STEPS+99 with a finite validation
# cross entropy in (0, 10) and a test accuracy >= MIN_ACC: one worker's lines never stand in for
# another's. Prints them.
check_replica_worker() {
    local log=$1 w=$2 steps=$3 min=$4 wl="$TMP/worker$2" step loss acc
    grep "^\[worker$w\] " "$log" > "$wl" || fail "worker $w printed nothing"
    step=$(sed -n 's/^\[worker[0-9]*\] After \([^ ]*\) training step(s).*/\1/p' "$wl")
    loss=$(sed -n 's/^\[worker[0-9]*\] After .*, validation cross entropy = \(.*\)$/\1/p' "$wl")
    acc=$(sed -n "s/^\[worker[0-9]*\] Worker $w: validation accuracy = \([^ ]*\) .*/\1/p" "$wl")
    echo "worker $w: global step $step, validation cross entropy $loss, accuracy $acc"
    [ -n "$step" ] || fail "worker $w printed no \"After N training step(s)\" line"
    check_number "worker $w's final global step" "$step"
    [ "$step" -ge "$steps" ] && [ "$step" -lt $((steps + 100)) ] ||
        fail "worker $w ended at global step $step, expected $steps..$((steps + 99))"
    check_number "worker $w's validation cross entropy" "$loss"
    awk -v l="$loss" 'BEGIN { exit !(l + 0 > 0 && l + 0 < 10) }' || fail "worker $w's validation cross entropy $loss is not in (0, 10)"
    check_ge "worker $w accuracy" "$acc" "$min"
}
# check_loss_table LOG WHAT COL NF [TOL]: in LOG's rows of NF fields whose field COL-1 is a step
# number, the two losses in fields COL and COL+1 (distributed, single-process) are finite
# numbers, and the distributed loss of the last row is below that of the first. With TOL, the
# two losses of every row also agree: they differ by at most TOL relative to the single-process
# loss, plus one unit in the last printed digit (both are rounded as printed).
check_loss_table() {
    awk -v what="$2" -v col="$3" -v nf="$4" -v tol="${5:-}" '
        function unit(s) { return s ~ /\./ ? 10 ^ -(length(s) - index(s, ".")) : 1 }
        NF == nf && $(col - 1) ~ /^[0-9]+$/ {
            finite = 1
            for (i = col; i <= col + 1; i++)
                if ($i !~ /^-?[0-9]+(\.[0-9]+)?$/) {
                    print "FAIL: " what ": loss \"" $i "\" at step " $(col - 1) " is not finite"
                    bad = 1
                    finite = 0
                }
            a = $col + 0
            b = $(col + 1) + 0
            d = a > b ? a - b : b - a
            if (finite && tol != "" && !(d <= tol * (b < 0 ? -b : b) + unit($col))) {
                print "FAIL: " what ": the losses at step " $(col - 1) " differ: " $col " vs " $(col + 1)
                bad = 1
            }
            if (n == 0) first = $col; last = $col; n++
        }
        END {
            if (bad) exit 1
            if (n < 2) { print "FAIL: " what ": no loss table"; exit 1 }
            if (!(last + 0 < first + 0)) { print "FAIL: " what ": the loss did not fall (" first " -> " last ")"; exit 1 }
            printf "%s: loss %s -> %s over %d rows, all finite%s\n", what, first, last, n,
                tol != "" ? ", the two curves within " tol : ""
        }' "$1"
}
# check_curves LOG WHAT: checks an in_graph_replication log on its own numbers, not on its
# verdict line (the program exits 3 when its curves differ; the caller checks that): the two
# loss curves agree row by row within the program's default tolerance (1e-9), every loss is
# finite and the loss falls, and the largest relative loss difference it reports is a number
# <= 1e-9.
check_curves() {
    check_loss_table "$1" "$2" 2 3 1e-9 || { cat "$1"; fail "$2: the loss table"; }
    check_le "$2: largest relative loss difference" "$(sed -n 's/^largest relative loss difference: //p' "$1")" 1e-9
}
