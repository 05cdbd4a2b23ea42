#!/usr/bin/env bash
# Sync replicas following the live workers (mnist_replica --sync_replicas --sync_live_probe_ms,
# dg_sync_replicas_hook_follow_live_workers): 1 ps + 3 workers, every step averaging all three.
# Worker 2 is SIGKILLed mid-training, then started again 1 s later. Checked from the programs'
# own timestamps and messages:
# - the chief says worker task 2 is lost and that 2 of 3 workers are live, and its global step
#   moves again within 3 s of the kill (0.25-0.6 s here; without following, it waits
#   --sync_timeout_ms, 20 s here, and fails: sync_missing_worker.sh; bench/elastic_chaos.sh
#   synclive measures the resume under chaos);
# - the restarted worker is counted again (3 of 3 live) and trains;
# - every process ends with status 0, under a hard deadline, and the test accuracy is >= 0.80.
source "$(dirname "$0")/common.bash"
read -r PP P0 P1 P2 <<< "$(free_ports 4)"
H="--ps_hosts 127.0.0.1:$PP --worker_hosts 127.0.0.1:$P0,127.0.0.1:$P1,127.0.0.1:$P2"
STEPS=6000
S="--sync_replicas --sync_live_probe_ms 200 --sync_timeout_ms 20000 --train_steps $STEPS --quiet --log_every 10"
"$BIN/mnist_replica" --job_name ps --task_index 0 $H --quiet > "$TMP/ps" 2>&1 &
PS=$!
PIDS+=($PS)
declare -A pid_of
for i in 0 1 2; do
    "$BIN/mnist_replica" --job_name worker --task_index "$i" $H $S > "$TMP/w$i" 2>&1 &
    pid_of[$i]=$!
    PIDS+=($!)
done
seen=$(wait_step "$TMP/w0" 1000 1200)
[ -n "$seen" ] && [ "$seen" -ge 1000 ] || { tail -5 "$TMP/w0"; fail "the chief did not reach global step 1000"; }
kill -9 "${pid_of[2]}"
killed=$(date +%s.%N)
wait "${pid_of[2]}" 2>/dev/null || true
echo "killed worker 2 at global step $seen"
sleep 1
"$BIN/mnist_replica" --job_name worker --task_index 2 $H $S > "$TMP/w2b" 2>&1 &
pid_of[2]=$!
PIDS+=($!)
deadline=$((SECONDS + 180))
for i in 0 1 2; do wait_ok "$deadline" "worker $i" "${pid_of[$i]}" "$TMP"/w*; done
grep "sync replicas:" "$TMP/w0"
grep -q "sync replicas: worker task 2 is lost" "$TMP/w0" || fail "the chief never said worker task 2 was lost"
grep -q "sync replicas: 2 of 3 workers live" "$TMP/w0" || fail "the chief never went on with 2 of 3 workers"
grep -q "sync replicas: worker task 2 answers again" "$TMP/w0" || fail "the chief never saw worker 2 again"
grep -q "sync replicas: 3 of 3 workers live" "$TMP/w0" || fail "the chief never counted worker 2 again"
grep -q "training step [0-9]* done" "$TMP/w2b" || { cat "$TMP/w2b"; fail "the restarted worker 2 never trained"; }
# The chief's first progress line after the kill whose global step is past the one it had then.
at_kill=$(awk -v t="$killed" -F': ' '$1 + 0 > 0 && $1 + 0 < t + 0' "$TMP/w0" | sed -n 's/.*(global step: \([0-9]*\)).*/\1/p' | tail -1)
check_number "the chief's global step at the kill" "$at_kill"
moved=$(awk -v t="$killed" -v s="$at_kill" -F': ' '$1 + 0 >= t + 0 && match($0, /global step: [0-9]+/) {
            g = substr($0, RSTART + 13, RLENGTH - 13) + 0; if (g > s + 10) { print $1; exit } }' "$TMP/w0")
check_number "the time the chief's global step moved on after the kill" "$moved"
gap=$(awk -v a="$moved" -v b="$killed" 'BEGIN { printf "%.3f", a - b }')
echo "worker 2 killed at global step $at_kill: the chief's global step passed $((at_kill + 10)) after $gap s"
check_le "seconds from the kill to the chief's next steps" "$gap" 3.0
acc=$(sed -n 's/^Worker 0: validation accuracy = \([0-9.]*\) .*/\1/p' "$TMP/w0")
check_ge "the chief's test accuracy" "$acc" 0.80
echo "PASS sync_live_workers (resumed after $gap s; accuracy $acc)"
