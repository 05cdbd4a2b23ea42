#!/usr/bin/env bash
# Loss scaling under all-reduce (mnist_replica --all_reduce --mixed_precision fp16,
# dg_all_reduce_minimize_with_loss_scale), 2 workers. Only worker 1 forces an overflow (its loss
# times 1e30 at local steps 100-102); the scaled gradients are averaged before they are checked,
# so worker 0 skips the same three steps: both print the same skips and scales, end with the
# same variables (the same test cross entropy, to the digit) and train to accuracy >= 0.84.
# Checking before the all-reduce would let worker 0 apply what worker 1 skipped, and the two
# copies of the model would part. Then the same under sync replicas (1 ps + 2 workers,
# dg_sync_replicas_minimize_with_loss_scale): the chief checks the averages it takes, so the
# three steps are skipped for both workers, which read the same scale and skip count.
source "$(dirname "$0")/common.bash"
read -r P0 P1 <<< "$(free_ports 2)"
H="--worker_hosts 127.0.0.1:$P0,127.0.0.1:$P1"
A="--all_reduce --mixed_precision fp16 --train_steps 2000 --log_every 500 --quiet"
"$BIN/mnist_replica" --job_name worker --task_index 0 $H $A > "$TMP/w0" 2>&1 &
W0=$!
PIDS+=($W0)
"$BIN/mnist_replica" --job_name worker --task_index 1 $H $A --force_overflow_at 100 > "$TMP/w1" 2>&1 &
W1=$!
PIDS+=($W1)
for w in 0 1; do
    pid=$W0
    [ "$w" = 1 ] && pid=$W1
    timeout 180 tail --pid="$pid" -f /dev/null || fail "worker $w still runs after 180 s"
    wait "$pid" || { tail -n 20 "$TMP/w$w"; fail "worker $w exited with an error"; }
done
skips() { sed -n 's/.*Worker [01]: local step \([0-9]*\): gradients not finite, update skipped (loss scale now \([0-9]*\);.*/\1 \2/p' "$1"; }
skips "$TMP/w0" > "$TMP/s0"
skips "$TMP/w1" > "$TMP/s1"
cat "$TMP/s1"
[ "$(tr '\n' ' ' < "$TMP/s1")" = "100 16384 101 8192 102 4096 " ] || fail "worker 1's skips: $(tr '\n' ' ' < "$TMP/s1")"
cmp -s "$TMP/s0" "$TMP/s1" || fail "worker 0 skipped other steps than worker 1: $(tr '\n' ' ' < "$TMP/s0")"
ce() { sed -n 's/^After [0-9]* training step(s), validation cross entropy = \([0-9.]*\)$/\1/p' "$1"; }
c0=$(ce "$TMP/w0")
c1=$(ce "$TMP/w1")
check_number "worker 0's test cross entropy" "$c0"
[ "$c0" = "$c1" ] || fail "the workers end with other variables (cross entropy $c0 and $c1)"
acc=$(sed -n 's/^Worker 0: validation accuracy = \([0-9.]*\) .*/\1/p' "$TMP/w0")
check_ge "the test accuracy" "$acc" 0.84
grep "^Loss scaling" "$TMP/w0"
ar_acc=$acc

# Sync replicas: the variables, the scale and its counters on the ps.
read -r PP P0 P1 <<< "$(free_ports 3)"
H="--ps_hosts 127.0.0.1:$PP --worker_hosts 127.0.0.1:$P0,127.0.0.1:$P1"
S="--sync_replicas --mixed_precision fp16 --train_steps 2000 --log_every 500 --quiet"
"$BIN/mnist_replica" --job_name ps --task_index 0 $H --quiet > "$TMP/ps" 2>&1 &
PIDS+=($!)
"$BIN/mnist_replica" --job_name worker --task_index 0 $H $S > "$TMP/s0" 2>&1 &
W0=$!
PIDS+=($W0)
"$BIN/mnist_replica" --job_name worker --task_index 1 $H $S --force_overflow_at 100 > "$TMP/s1" 2>&1 &
W1=$!
PIDS+=($W1)
deadline=$((SECONDS + 180))
wait_ok "$deadline" "sync worker 0" "$W0" "$TMP/s0" "$TMP/s1"
wait_ok "$deadline" "sync worker 1" "$W1" "$TMP/s0" "$TMP/s1"
scales() { sed -n 's/.*gradients not finite, update skipped (loss scale now \([0-9]*\);.*/\1/p' "$1" | tr '\n' ' '; }
for w in 0 1; do
    [ "$(scales "$TMP/s$w")" = "16384 8192 4096 " ] || { cat "$TMP/s$w"; fail "sync worker $w saw scales \"$(scales "$TMP/s$w")\""; }
    grep -q "^Loss scaling: scale 4096, 3 steps skipped$" "$TMP/s$w" || fail "sync worker $w does not end with 3 steps skipped"
done
s0=$(ce "$TMP/s0")
s1=$(ce "$TMP/s1")
check_number "sync worker 0's test cross entropy" "$s0"
[ "$s0" = "$s1" ] || fail "sync: the workers read other variables (cross entropy $s0 and $s1)"
sacc=$(sed -n 's/^Worker 0: validation accuracy = \([0-9.]*\) .*/\1/p' "$TMP/s0")
check_ge "the sync test accuracy" "$sacc" 0.84
echo "PASS allreduce_loss_scale (all-reduce: both skipped local steps 100-102, cross entropy $c0 on both," \
    "accuracy $ar_acc; sync replicas: 3 steps skipped for both, accuracy $sacc)"
