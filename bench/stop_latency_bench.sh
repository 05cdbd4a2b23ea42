#!/usr/bin/env bash
# stop_latency_bench: how fast the command-line tools stop, the figures the smoke tests print
# but no longer bound (tests/smoke/dg_server_smoke.sh, dg_launch_smoke.sh run beside other
# tests and under valgrind, where any bound is a guess). ROUNDS times each:
#   - dg-server: SIGTERM, and SIGINT, to exit (the process gone), once it serves;
#   - dg-launch: a worker exits 3 while the other tasks would run forever, to the launcher's
#     exit 1 (the task's own 0.2 s before it fails not counted);
#   - dg-launch --timeout 1 over tasks that never end: how far past the 1 s it exits (124).
# JSON lines, one per figure: the median and the largest of the rounds, in ms.
#   ROUNDS=5 bench/stop_latency_bench.sh
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${ROUNDS:-5}
BIN=${DG_BIN_DIR:-build/bin}
source bench/lib.bash
now_ms() { echo $(( $(date +%s%N) / 1000000 )); }
line() {   # line METRIC FILE: the median and the largest of the numbers in FILE
    local med max
    med=$(median < "$2")
    max=$(sort -n "$2" | tail -1)
    echo "{\"bench\": \"stop_latency_bench\", \"metric\": \"$1\", \"value\": $med, \"max\": $max, \"unit\": \"ms\", \"rounds\": $ROUNDS}"
}

# dg-server: the time from the signal to the process being gone.
for sig in TERM INT; do
    : > "$TMP/server_$sig"
    for _ in $(seq "$ROUNDS"); do
        port=$(ports 1)
        "$BIN/dg-server" --cluster_spec "ps|127.0.0.1:$port" --job_name ps --task_index 0 > "$TMP/s.log" 2>&1 &
        pid=$!
        PIDS+=("$pid")
        for _ in $(seq 1200); do grep -qs "serving at" "$TMP/s.log" && break; sleep 0.025; done
        grep -qs "serving at" "$TMP/s.log" || { cat "$TMP/s.log" >&2; echo "stop_latency_bench: no server" >&2; exit 1; }
        t0=$(now_ms)
        kill "-$sig" "$pid"
        while kill -0 "$pid" 2>/dev/null; do sleep 0.002; done
        echo $(( $(now_ms) - t0 )) >> "$TMP/server_$sig"
        wait "$pid" || { echo "stop_latency_bench: dg-server exited $? on SIG$sig" >&2; exit 1; }
    done
    line "dg_server_sig${sig,,}_to_exit" "$TMP/server_$sig"
done

# dg-launch: bash tasks; a worker fails after 0.2 s, or every task runs until stopped.
cat > "$TMP/task.sh" <<'TASK'
#!/usr/bin/env bash
idx=""
while [ $# -gt 0 ]; do case "$1" in --task_index) idx=$2; shift;; esac; shift; done
if [ "${T_FAIL:-none}" = "$idx" ]; then sleep 0.2; exit 3; fi
while :; do sleep 0.05; done
TASK
chmod +x "$TMP/task.sh"
: > "$TMP/launch_fail"
: > "$TMP/launch_timeout"
for _ in $(seq "$ROUNDS"); do
    t0=$(now_ms)
    rc=0
    T_FAIL=1 "$BIN/dg-launch" --workers 3 -- "$TMP/task.sh" > /dev/null 2>&1 || rc=$?
    [ "$rc" -eq 1 ] || { echo "stop_latency_bench: dg-launch exited $rc for a failing worker, want 1" >&2; exit 1; }
    echo $(( $(now_ms) - t0 - 200 )) >> "$TMP/launch_fail"
    t0=$(now_ms)
    rc=0
    "$BIN/dg-launch" --ps 1 --workers 2 --timeout 1 -- "$TMP/task.sh" > /dev/null 2>&1 || rc=$?
    [ "$rc" -eq 124 ] || { echo "stop_latency_bench: dg-launch --timeout 1 exited $rc, want 124" >&2; exit 1; }
    echo $(( $(now_ms) - t0 - 1000 )) >> "$TMP/launch_timeout"
done
line "dg_launch_failed_worker_to_exit" "$TMP/launch_fail"
line "dg_launch_timeout_1s_overshoot" "$TMP/launch_timeout"
