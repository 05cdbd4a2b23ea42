#!/usr/bin/env bash
# dg-launch with small bash tasks (no distgraph runtime needed): output prefixes and whole
# lines, the task flags and host lists, TF_CONFIG mode, a failing or killed worker stopping the
# cluster (exit 1, no task left), --timeout (124), SIGTERM to the launcher (143), a ps that
# ignores SIGTERM (SIGKILL after 5 s), --keep_ps, usage errors (2).
# No check bounds how long a working launcher takes (the test runs beside others, maybe under
# valgrind): durations are printed, and only lower bounds are checked (--timeout 1 does not end
# before 1 s, the grace period is not cut short). A launcher that never ends is stopped by the
# hang guard below and fails its check; bench/stop_latency_bench.sh measures the speed.
set -euo pipefail
launch="${DG_BIN_DIR:?}/dg-launch"
[ -x "$launch" ] || { echo "no $launch"; exit 1; }
tmp=$(mktemp -d)
cleanup() {
    # Nothing should be left; if a check failed half-way, do not leave tasks behind either.
    for f in "$tmp"/*.pid; do [ -e "$f" ] && kill -9 "$(cat "$f")" 2>/dev/null || true; done
    rm -rf "$tmp"
}
trap cleanup EXIT
fail() { echo "FAIL: $*"; exit 1; }
now_ms() { echo $(( $(date +%s%N) / 1000000 )); }
# A deadlock guard, not a performance claim: guard CMD... runs CMD and kills it (exit 137)
# when it has not ended after HANG_GUARD s, so that a launcher that never stops its cluster
# fails the check on its exit status instead of hanging the test.
HANG_GUARD=60
guard() { timeout -s KILL "$HANG_GUARD" "$@"; }

# The task: records its pid, args and TF_CONFIG, prints to stdout and stderr, then acts by
# role. A ps task marks itself ready when it has written its lines; workers wait for T_NPS ready
# ps tasks before going on, so no ps is stopped before its output is out. Env: T_FAIL (worker
# index that fails), T_HOW (exit code, or "kill9"), T_HANG (workers sleep forever),
# T_PS_IGNORE_TERM, T_PS_EXIT_AFTER (seconds, then the ps exits 0), T_LINES (lines written in two pieces each).
cat > "$tmp/task.sh" <<'EOF'
#!/usr/bin/env bash
job=""; idx=""
args="$*"
while [ $# -gt 0 ]; do
    case "$1" in --job_name) job=$2; shift;; --task_index) idx=$2; shift;; esac
    shift
done
if [ -z "$job" ] && [ -n "${TF_CONFIG:-}" ]; then
    read -r job idx < <(python3 -c 'import json,os; t=json.loads(os.environ["TF_CONFIG"])["task"]; print(t["type"], t["index"])')
fi
dir="$T_DIR"
echo $$ > "$dir/$job$idx.pid"
echo "args: $args"
echo "stderr of $job$idx" >&2
echo "tf_config: ${TF_CONFIG:-none}"
for ((i = 0; i < ${T_LINES:-0}; i++)); do printf 'piece-one '; printf 'piece-two %s\n' "$i"; done
if [ "$job" = ps ]; then
    [ -n "${T_PS_IGNORE_TERM:-}" ] && trap '' TERM
    touch "$dir/$job$idx.ready"
    if [ -n "${T_PS_EXIT_AFTER:-}" ]; then sleep "$T_PS_EXIT_AFTER"; echo "ps done"; exit 0; fi
    while :; do sleep 0.05; done
fi
for ((i = 0; i < 1200; i++)); do   # 60 s at most: a guard, not an expectation
    [ "$(ls "$dir" | grep -c '^ps.*\.ready$')" -ge "${T_NPS:-0}" ] && break
    sleep 0.05
done
if [ "$idx" = "${T_FAIL:-none}" ]; then
    sleep 0.2
    [ "$T_HOW" = kill9 ] && kill -9 $$
    exit "$T_HOW"
fi
[ -n "${T_HANG:-}" ] && while :; do sleep 0.05; done
exit 0
EOF
chmod +x "$tmp/task.sh"
export T_DIR="$tmp"

reset() { rm -f "$tmp"/*.pid "$tmp"/*.ready; }

all_gone() {
    for f in "$tmp"/*.pid; do
        [ -e "$f" ] || continue
        kill -0 "$(cat "$f")" 2>/dev/null && fail "task $(basename "$f" .pid) (pid $(cat "$f")) is still running"
    done
    return 0
}

# 1. flags mode: 2 ps, 3 workers.
reset
set +e
T_NPS=2 T_LINES=200 guard "$launch" --ps 2 --workers 3 -- "$tmp/task.sh" extra1 "extra 2" > "$tmp/out" 2> "$tmp/err"
rc=$?
set -e
[ "$rc" -eq 0 ] || { cat "$tmp/out" "$tmp/err"; fail "flags mode: exit $rc, want 0"; }
# Every line carries a task prefix, and lines written in two pieces stay whole.
bad=$(grep -cvE '^\[(ps[01]|worker[012])\] ' "$tmp/out" || true)
[ "$bad" -eq 0 ] || { grep -vE '^\[(ps[01]|worker[012])\] ' "$tmp/out" | head; fail "$bad lines without a prefix"; }
for t in ps0 ps1 worker0 worker1 worker2; do
    grep -qx "\[$t\] stderr of $t" "$tmp/out" || fail "no stderr line of $t"
    n=$(grep -cE "^\[$t\] piece-one piece-two [0-9]+\$" "$tmp/out" || true)
    [ "$n" -eq 200 ] || fail "$t: $n of 200 two-piece lines are whole"
    grep -qx "\[$t\] tf_config: none" "$tmp/out" || fail "$t has TF_CONFIG set in flags mode"
done
ps_hosts=""; worker_hosts=""
for t in ps0 ps1 worker0 worker1 worker2; do
    job=${t%[0-9]}; idx=${t#"$job"}
    line=$(grep "^\[$t\] args: " "$tmp/out") || fail "no args line of $t"
    re="^\[$t\] args: extra1 extra 2 --job_name $job --task_index $idx --ps_hosts ([^ ]+) --worker_hosts ([^ ]+)\$"
    [[ "$line" =~ $re ]] || fail "$t: unexpected args: $line"
    p=${BASH_REMATCH[1]}; w=${BASH_REMATCH[2]}
    [ -z "$ps_hosts" ] && { ps_hosts=$p; worker_hosts=$w; }
    [ "$p" = "$ps_hosts" ] && [ "$w" = "$worker_hosts" ] || fail "$t got other host lists: $p / $w"
done
[[ "$ps_hosts" =~ ^127\.0\.0\.1:[0-9]+,127\.0\.0\.1:[0-9]+$ ]] || fail "ps_hosts $ps_hosts"
[[ "$worker_hosts" =~ ^127\.0\.0\.1:[0-9]+(,127\.0\.0\.1:[0-9]+){2}$ ]] || fail "worker_hosts $worker_hosts"
n_ports=$(echo "$ps_hosts,$worker_hosts" | tr , '\n' | sort -u | wc -l)
[ "$n_ports" -eq 5 ] || fail "ports are not distinct: $ps_hosts $worker_hosts"
all_gone
echo "ok: flags mode ($ps_hosts / $worker_hosts)"

# 2. tf_config mode, with --base_port.
if command -v python3 > /dev/null; then
    reset
    base=$(( 20000 + RANDOM % 20000 ))
    set +e
    T_NPS=1 guard "$launch" --ps 1 --workers 2 --mode tf_config --base_port "$base" -- "$tmp/task.sh" > "$tmp/out" 2> "$tmp/err"
    rc=$?
    set -e
    [ "$rc" -eq 0 ] || { cat "$tmp/out" "$tmp/err"; fail "tf_config mode: exit $rc"; }
    for t in ps0 worker0 worker1; do
        job=${t%[0-9]}; idx=${t#"$job"}
        grep -qx "\[$t\] args: " "$tmp/out" || fail "$t got arguments in tf_config mode"
        cfg=$(sed -n "s/^\[$t\] tf_config: //p" "$tmp/out")
        TF_CONFIG="$cfg" python3 - "$job" "$idx" "$base" <<'EOF' || fail "$t: bad TF_CONFIG: $cfg"
import json, os, sys
job, idx, base = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
c = json.loads(os.environ["TF_CONFIG"])
assert c["task"] == {"type": job, "index": idx}, c["task"]
ps, wk = c["cluster"]["ps"], c["cluster"]["worker"]
assert len(ps) == 1 and len(wk) == 2, c["cluster"]
ports = [int(a.split(":")[1]) for a in ps + wk]
assert all(a.startswith("127.0.0.1:") for a in ps + wk), c["cluster"]
assert len(set(ports)) == 3 and ports == sorted(ports) and min(ports) >= base, ports
EOF
    done
    all_gone
    echo "ok: tf_config mode"
else
    echo "SKIP: tf_config mode: no python3 to write and read TF_CONFIG"
fi

# 3. A worker exits 3 while the others would run forever: exit 1, the message, nothing left
# running.
reset
t0=$(now_ms)
set +e
T_NPS=2 T_FAIL=1 T_HOW=3 T_HANG=1 guard "$launch" --ps 2 --workers 3 -- "$tmp/task.sh" > "$tmp/out" 2> "$tmp/err"
rc=$?
set -e
dt=$(( $(now_ms) - t0 ))
[ "$rc" -eq 1 ] || { cat "$tmp/out" "$tmp/err"; fail "failing worker: exit $rc, want 1"; }
grep -qx "dg-launch: worker 1 exited with status 3" "$tmp/err" || { cat "$tmp/err"; fail "no failure message"; }
[ "$(ls "$tmp"/*.pid | wc -l)" -eq 5 ] || fail "not every task started"
all_gone
echo "ok: failing worker ($dt ms)"

# 4. A worker killed by SIGKILL.
reset
set +e
T_FAIL=0 T_HOW=kill9 T_HANG=1 guard "$launch" --ps 1 --workers 2 -- "$tmp/task.sh" > "$tmp/out" 2> "$tmp/err"
rc=$?
set -e
[ "$rc" -eq 1 ] || fail "killed worker: exit $rc, want 1"
grep -qx "dg-launch: worker 0 killed by signal 9" "$tmp/err" || { cat "$tmp/err"; fail "no killed-by-signal message"; }
all_gone
echo "ok: killed worker"

# 5. --timeout: exit 124 with a message.
reset
t0=$(now_ms)
set +e
T_HANG=1 guard "$launch" --ps 1 --workers 2 --timeout 1 -- "$tmp/task.sh" > "$tmp/out" 2> "$tmp/err"
rc=$?
set -e
dt=$(( $(now_ms) - t0 ))
[ "$rc" -eq 124 ] || fail "timeout: exit $rc, want 124"
grep -q "dg-launch: timeout" "$tmp/err" || { cat "$tmp/err"; fail "no timeout message"; }
[ "$dt" -ge 900 ] || fail "timeout 1 s ended after $dt ms"
all_gone
echo "ok: timeout ($dt ms)"

# 6. SIGTERM to dg-launch (once both tasks run): 143, tasks stopped.
reset
T_HANG=1 "$launch" --ps 1 --workers 1 -- "$tmp/task.sh" > "$tmp/out" 2> "$tmp/err" &
lpid=$!
for ((i = 0; i < HANG_GUARD * 20; i++)); do [ "$(ls "$tmp"/*.pid 2>/dev/null | wc -l)" -eq 2 ] && break; sleep 0.05; done
[ "$(ls "$tmp"/*.pid 2>/dev/null | wc -l)" -eq 2 ] || { kill -9 "$lpid"; fail "SIGTERM: the tasks did not start within $HANG_GUARD s"; }
kill -TERM "$lpid"
# The hang guard: a launcher still running after HANG_GUARD s is killed (exit 137).
timeout "$HANG_GUARD" tail -s 0.05 --pid="$lpid" -f /dev/null || kill -9 "$lpid" 2>/dev/null || true
set +e
wait "$lpid"
rc=$?
set -e
[ "$rc" -eq 143 ] || fail "SIGTERM: exit $rc, want 143"
all_gone
echo "ok: SIGTERM to the launcher"

# 7. A ps that ignores SIGTERM is killed after the 5 s grace period; the workers' success wins.
reset
t0=$(now_ms)
set +e
T_NPS=1 T_PS_IGNORE_TERM=1 guard "$launch" --ps 1 --workers 1 -- "$tmp/task.sh" > "$tmp/out" 2> "$tmp/err"
rc=$?
set -e
dt=$(( $(now_ms) - t0 ))
[ "$rc" -eq 0 ] || { cat "$tmp/err"; fail "stubborn ps: exit $rc, want 0"; }
grep -q "ps 0 did not stop within 5 s, sending SIGKILL" "$tmp/err" || { cat "$tmp/err"; fail "no SIGKILL message"; }
[ "$dt" -ge 4900 ] || fail "stubborn ps: killed after $dt ms, before the 5 s grace period"
all_gone
echo "ok: SIGKILL after the grace period ($dt ms)"

# 8. --keep_ps: the launcher waits for the ps tasks to exit by themselves.
reset
set +e
T_NPS=1 T_PS_EXIT_AFTER=1 guard "$launch" --keep_ps --ps 1 --workers 2 -- "$tmp/task.sh" > "$tmp/out" 2> "$tmp/err"
rc=$?
set -e
[ "$rc" -eq 0 ] || { cat "$tmp/out" "$tmp/err"; fail "--keep_ps: exit $rc, want 0"; }
grep -qx "\[ps0\] ps done" "$tmp/out" || { cat "$tmp/out"; fail "--keep_ps: the ps was stopped"; }
all_gone
echo "ok: --keep_ps"

# 9. Usage.
help=$(guard "$launch" --help) || fail "--help exits $?"
grep -q -- "--keep_ps" <<< "$help" || fail "--help does not document --keep_ps"
for bad in "--ps 1 -- true" "--workers 0 -- true" "--workers 1 --mode grpc -- true" "--workers 1 --bogus -- true" \
           "--workers 1" "--workers 1 --timeout -1 -- true" "--workers 3:2 -- true" "--workers 0:2 -- true" \
           "--workers 2: -- true" "--workers 1:2 --mode standing -- true" "--workers 1 --control -- true"; do
    set +e
    # shellcheck disable=SC2086
    msg=$(guard "$launch" $bad 2>&1)
    rc=$?
    set -e
    [ "$rc" -eq 2 ] || fail "dg-launch $bad: exit $rc, want 2"
    [[ "$msg" == dg-launch:* ]] || fail "dg-launch $bad: message \"$msg\""
done
set +e
guard "$launch" --workers 1 -- "$tmp/no-such-program" > "$tmp/out" 2> "$tmp/err"
rc=$?
set -e
[ "$rc" -eq 1 ] && grep -q "cannot run" "$tmp/out" || fail "missing program: exit $rc"
# --control's FIFO must be new: an existing path is refused and left as it was.
touch "$tmp/ctl"
set +e
guard "$launch" --workers 1 --control "$tmp/ctl" -- true > "$tmp/out" 2> "$tmp/err"
rc=$?
set -e
[ "$rc" -eq 1 ] && grep -q "control $tmp/ctl: File exists" "$tmp/err" && [ -f "$tmp/ctl" ] ||
    fail "--control on an existing file: exit $rc, $(cat "$tmp/err")"
echo "ok: usage"
echo "dg_launch smoke: all passed"
