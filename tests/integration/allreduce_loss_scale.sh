#!/usr/bin/env bash
# Loss scaling under all-reduce (mnist_replica --all_reduce --mixed_precision fp16,
# dg_all_reduce_minimize_with_loss_scale), 2 workers. Only worker 1 forces an overflow (its loss
# times 1e30 at local steps 100-102); the scaled gradients are averaged before they are checked,
# so worker 0 skips the same three steps: both print the same skips and scales, end with the
# same variables (the same test cross entropy, to the digit) and train to accuracy >= 0.84.
# Checking before the all-reduce would let worker 0 apply what worker 1 skipped, and the two
# copies of the model would part. Then the same under sync replicas (1 ps + 2 workers,
# dg_sync_replicas_minimize_with_loss_scale): the chief checks the averages it takes, so the
# three steps are skipped for both workers, which read the same scale and skip count. The
# all-reduce part runs again with the session's mixed-precision rewrite (--amp rewrite).
source "$(dirname "$0")/common.bash"
# two_workers LOG HOSTS FLAGS: workers 0 and 1 (1 forcing the overflow), their logs LOG0 and
# LOG1, both waited for (status 0, within 180 s).
two_workers() {
    local log=$1 hosts=$2 flags=$3 pids=() w
    for w in 0 1; do
        local extra=""
        [ "$w" = 1 ] && extra="--force_overflow_at 100"
        # shellcheck disable=SC2086
        "$BIN/mnist_replica" --job_name worker --task_index "$w" $hosts $flags $extra > "$log$w" 2>&1 &
        pids+=($!)
        PIDS+=($!)
    done
    local deadline=$((SECONDS + 180))
    for w in 0 1; do wait_ok "$deadline" "worker $w" "${pids[$w]}" "$log"0 "$log"1; done
}
read -r P0 P1 <<< "$(free_ports 2)"
two_workers "$TMP/w" "--worker_hosts 127.0.0.1:$P0,127.0.0.1:$P1" \
    "--all_reduce --mixed_precision fp16 --train_steps 2000 --log_every 500 --quiet"
skips() { sed -n 's/.*Worker [01]: local step \([0-9]*\): gradients not finite, update skipped (loss scale now \([0-9]*\);.*/\1 \2/p' "$1"; }
skips "$TMP/w0" > "$TMP/skips0"
skips "$TMP/w1" > "$TMP/skips1"
cat "$TMP/skips1"
[ "$(tr '\n' ' ' < "$TMP/skips1")" = "100 16384 101 8192 102 4096 " ] || fail "worker 1's skips: $(tr '\n' ' ' < "$TMP/skips1")"
cmp -s "$TMP/skips0" "$TMP/skips1" || fail "worker 0 skipped other steps than worker 1: $(tr '\n' ' ' < "$TMP/skips0")"
ce() { sed -n 's/^After [0-9]* training step(s), validation cross entropy = \([0-9.]*\)$/\1/p' "$1"; }
c0=$(ce "$TMP/w0")
c1=$(ce "$TMP/w1")
check_number "worker 0's test cross entropy" "$c0"
[ "$c0" = "$c1" ] || fail "the workers end with other variables (cross entropy $c0 and $c1)"
acc=$(sed -n 's/^Worker 0: validation accuracy = \([0-9.]*\) .*/\1/p' "$TMP/w0")
check_ge "the test accuracy" "$acc" 0.84
grep "^Loss scaling" "$TMP/w0"
ar_acc=$acc

# The same with the products made float16 by the session's rewrite (--amp rewrite), which
# keeps the loss scaler's unscaling in float32: the same skips on both workers, the same
# variables at the end.
read -r P0 P1 <<< "$(free_ports 2)"
two_workers "$TMP/r" "--worker_hosts 127.0.0.1:$P0,127.0.0.1:$P1" \
    "--all_reduce --mixed_precision fp16 --amp rewrite --train_steps 2000 --log_every 500 --quiet"
grep -q "mixed precision: [0-9]* nodes compute in float16" "$TMP/r0" || fail "--amp rewrite: no rewrite reported"
skips "$TMP/r1" > "$TMP/rskips1"
skips "$TMP/r0" > "$TMP/rskips0"
[ "$(tr '\n' ' ' < "$TMP/rskips1")" = "100 16384 101 8192 102 4096 " ] || fail "rewrite: worker 1's skips: $(tr '\n' ' ' < "$TMP/rskips1")"
cmp -s "$TMP/rskips0" "$TMP/rskips1" || fail "rewrite: worker 0 skipped other steps than worker 1"
r0=$(ce "$TMP/r0")
check_number "rewrite: worker 0's test cross entropy" "$r0"
[ "$r0" = "$(ce "$TMP/r1")" ] || fail "rewrite: the workers end with other variables"
racc=$(sed -n 's/^Worker 0: validation accuracy = \([0-9.]*\) .*/\1/p' "$TMP/r0")
check_ge "the rewrite's test accuracy" "$racc" 0.84

# Sync replicas: the variables, the scale and its counters on the ps.
read -r PP P0 P1 <<< "$(free_ports 3)"
H="--ps_hosts 127.0.0.1:$PP --worker_hosts 127.0.0.1:$P0,127.0.0.1:$P1"
"$BIN/mnist_replica" --job_name ps --task_index 0 $H --quiet > "$TMP/ps" 2>&1 &
PIDS+=($!)
two_workers "$TMP/s" "$H" "--sync_replicas --mixed_precision fp16 --train_steps 2000 --log_every 500 --quiet"
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
    "accuracy $ar_acc; with the rewrite accuracy $racc; sync replicas: 3 steps skipped for both, accuracy $sacc)"
