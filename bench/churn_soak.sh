#!/usr/bin/env bash
# churn_soak: a ps under a worker that is SIGKILLed and restarted CYCLES times while the chief
# keeps training (MNIST-replica, 1 ps as a standing dg-server + 2 workers). Measures what the ps
# holds before and after: resident memory, open descriptors, and the shared-memory files of
# the job in /dev/shm; and its counters (graphs freed because their master left, steps
# running). Each worker incarnation trains until it has made progress, then dies mid-step.
# JSON lines; exits 1 when a figure ends more than BOUND_PCT (default 5) percent above where it
# started (descriptors: more than 2 above), or a dead worker's graphs or steps stay. Memory is
# judged by the ps's private memory (RssAnon: what a leak grows), with BOUND_KB (default 1024)
# of slack for the heap's own growth; its resident shared memory (RssShmem) grows as the
# shared-memory rings are written further round (up to their size) and is only reported, as is
# VmRSS, which holds both.
#   CYCLES=50 bench/churn_soak.sh       (tests/integration/churn.sh runs it with CYCLES=5)
# Needs build/bin (scripts/build.sh) and the Fashion-MNIST files (scripts/setup.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
CYCLES=${CYCLES:-50}
BOUND_PCT=${BOUND_PCT:-5}
BOUND_KB=${BOUND_KB:-1024}
ORPHAN_MS=1000
BIN=${DG_BIN_DIR:-build/bin}
source bench/lib.bash
read -r P0 P1 P2 <<< "$(ports 3)"
HOSTS=(--ps_hosts "127.0.0.1:$P0" --worker_hosts "127.0.0.1:$P1,127.0.0.1:$P2")
"$BIN/dg-server" --cluster_spec "ps|127.0.0.1:$P0;worker|127.0.0.1:$P1,127.0.0.1:$P2" --job_name ps --task_index 0 \
    --orphan_timeout_ms "$ORPHAN_MS" > "$TMP/ps.log" 2>&1 &
PS=$!
PIDS+=($PS)
stat_of() { "$BIN/dg-inspect" server "dg://127.0.0.1:$P0" | awk -v k="$1" '$1 == k { print $2 }'; }
rss_kb() { awk '/^VmRSS:/ { print $2 }' "/proc/$PS/status"; }
anon_kb() { awk '/^RssAnon:/ { print $2 }' "/proc/$PS/status"; }
shmem_kb() { awk '/^RssShmem:/ { print $2 }' "/proc/$PS/status"; }
fds() { find "/proc/$PS/fd" -mindepth 1 -maxdepth 1 2>/dev/null | wc -l; }
# Shared-memory regions of other processes the ps has mapped.
maps() { grep -o '/dev/shm/dg-shm-[0-9-]*' "/proc/$PS/maps" | sort -u | grep -vc "dg-shm-$PS-" || true; }
# The shared-memory files of this job's processes (the ps and the workers), in KiB, but for
# those of the worker killed last: a dead process's file goes when the next process of the
# host makes its own region (the restarted worker does), so one is always waiting.
shm_kb() {
    local total=0 f pid
    for f in /dev/shm/dg-shm-*; do
        [ -e "$f" ] || continue
        pid=${f#/dev/shm/dg-shm-}
        pid=${pid%%-*}
        [ "$pid" = "${WORKER:-}" ] && continue
        case " $PS $CHIEF ${GONE[*]:-} " in *" $pid "*) total=$((total + $(du -k "$f" | cut -f1))) ;; esac
    done
    echo "$total"
}
# What shm_kb counted, file by file, with whose it is (on a failure).
shm_list() {
    local f pid who
    for f in /dev/shm/dg-shm-*; do
        [ -e "$f" ] || continue
        pid=${f#/dev/shm/dg-shm-}
        pid=${pid%%-*}
        case " $pid " in
            " $PS ") who=ps ;; " $CHIEF ") who=chief ;; " ${WORKER:-} ") who="worker 1 (the last, not counted)" ;;
            *) case " ${GONE[*]:-} " in *" $pid "*) who="worker 1 (an earlier one)" ;; *) who="not of this job" ;; esac ;;
        esac
        kill -0 "$pid" 2>/dev/null && who="$who, running" || who="$who, gone"
        echo "  $f $(du -k "$f" | cut -f1) KiB: $who"
    done
}
for _ in $(seq 100); do stat_of registered_graphs >/dev/null 2>&1 && break; sleep 0.05; done
"$BIN/mnist_replica" --job_name worker --task_index 0 "${HOSTS[@]}" --train_steps 1000000000 --log_every 50 \
    --quiet > "$TMP/chief.log" 2>&1 &
CHIEF=$!
PIDS+=($CHIEF)
GONE=()
# One incarnation of worker 1: starts, trains until it logs progress, is killed mid-step.
cycle() {
    "$BIN/mnist_replica" --job_name worker --task_index 1 "${HOSTS[@]}" --train_steps 1000000000 --log_every 20 \
        --quiet > "$TMP/w1.log" 2>&1 &
    WORKER=$!
    PIDS+=($WORKER)
    local ok=0
    for _ in $(seq 400); do
        if grep -q "global step" "$TMP/w1.log" 2>/dev/null; then ok=1; break; fi
        kill -0 "$WORKER" 2>/dev/null || break
        sleep 0.05
    done
    [ $ok = 1 ] || { cat "$TMP/w1.log"; tail -5 "$TMP/ps.log"; echo "churn_soak: worker 1 made no progress" >&2; exit 1; }
    sleep "0.$((RANDOM % 5))"
    kill -9 "$WORKER"
    wait "$WORKER" 2>/dev/null || true
    GONE+=("$WORKER")
}
# Settle: the chief training, one worker-1 incarnation come and gone, its graphs freed.
settle() {
    sleep 0.3
    for _ in $(seq 100); do
        [ "$(stat_of running_steps)" -le 1 ] && break   # the chief's own step at most
        sleep 0.05
    done
    sleep "$(awk -v ms="$ORPHAN_MS" 'BEGIN { print ms / 1000 + 0.5 }')"
}
cycle
settle
rss0=$(rss_kb) anon0=$(anon_kb) shmem0=$(shmem_kb) fd0=$(fds) shm0=$(shm_kb) maps0=$(maps) graphs0=$(stat_of registered_graphs) orphaned0=$(stat_of graphs_orphaned)
start=$(date +%s.%N)
for i in $(seq "$CYCLES"); do
    cycle
    [ $((i % 10)) = 0 ] && echo "churn_soak: $i of $CYCLES worker restarts" >&2
done
settle
rss1=$(rss_kb) anon1=$(anon_kb) shmem1=$(shmem_kb) fd1=$(fds) shm1=$(shm_kb) maps1=$(maps) graphs1=$(stat_of registered_graphs) orphaned1=$(stat_of graphs_orphaned)
secs=$(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
kill -0 "$CHIEF" 2>/dev/null || { tail -20 "$TMP/chief.log"; echo "churn_soak: the chief died" >&2; exit 1; }
chief_step=$(sed -n 's/.*(global step: \([0-9]*\)).*/\1/p' "$TMP/chief.log" | tail -1)
pct() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", (b - a) * 100 / (a > 0 ? a : 1) }'; }
line() { echo "{\"bench\": \"churn_soak\", \"metric\": \"$1\", \"before\": $2, \"after\": $3, \"change_pct\": $(pct "$2" "$3"), \"unit\": \"$4\", \"restarts\": $CYCLES}"; }
line ps_rss "$rss0" "$rss1" KiB
line ps_private_memory "$anon0" "$anon1" KiB
line ps_shared_memory_resident "$shmem0" "$shmem1" KiB
line ps_fds "$fd0" "$fd1" descriptors
line job_shm "$shm0" "$shm1" KiB
line ps_mapped_regions_of_others "$maps0" "$maps1" regions
line ps_registered_graphs "$graphs0" "$graphs1" graphs
echo "{\"bench\": \"churn_soak\", \"metric\": \"graphs_freed_after_their_master_left\", \"value\": $((orphaned1 - orphaned0)), \"restarts\": $CYCLES, \"seconds\": $secs, \"chief_global_step\": ${chief_step:-0}}"
bad=0
awk -v a="$anon0" -v b="$anon1" -v p="$BOUND_PCT" -v k="$BOUND_KB" \
    'BEGIN { s = a * p / 100; if (s < k) s = k; exit !(b <= a + s) }' ||
    { echo "churn_soak: the ps's private memory grew by more than $BOUND_PCT% and $BOUND_KB KiB" >&2; bad=1; }
[ "$fd1" -le $((fd0 + 2)) ] || { echo "churn_soak: the ps holds $((fd1 - fd0)) more descriptors" >&2; bad=1; }
awk -v a="$shm0" -v b="$shm1" -v p="$BOUND_PCT" 'BEGIN { exit !(b <= a * (1 + p / 100)) }' ||
    { echo "churn_soak: /dev/shm of the job grew by more than $BOUND_PCT%" >&2; shm_list >&2; bad=1; }
[ "$maps1" -le "$maps0" ] || { echo "churn_soak: the ps maps $((maps1 - maps0)) more regions of other processes" >&2; bad=1; }
[ "$graphs1" -le "$graphs0" ] || { echo "churn_soak: the ps holds $((graphs1 - graphs0)) more graphs" >&2; bad=1; }
[ $((orphaned1 - orphaned0)) -ge "$CYCLES" ] ||
    { echo "churn_soak: only $((orphaned1 - orphaned0)) graphs of dead workers were freed" >&2; bad=1; }
exit $bad
