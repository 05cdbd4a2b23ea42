#!/usr/bin/env bash
# dg-launch --workers MIN:MAX --control FIFO with an elastic all-reduce job (mnist_replica
# --all_reduce --elastic; the coordinator on the ps task): workers 0 and 1 start; "add" and
# "add 3" through the FIFO start workers 2 and 3, which join the group; "remove" and "remove 2"
# stop them again (SIGTERM), and the group goes on with 0 and 1. Each change is one dg-launch
# line naming the workers running; a remove below MIN, a bad command and a worker out of range
# are refused with a message; the job ends with status 0, both workers with the same test
# accuracy, and the FIFO is removed. With --elastic_lr_scaling the learning rate follows the
# group's size: worker 0's progress lines show the base rate times 2/4 with 2 members, 4/4 once
# workers 2 and 3 are in, and 2/4 again at the end.
source "$(dirname "$0")/common.bash"
CTL="$TMP/control"
OUT="$TMP/out"
"$BIN/dg-launch" --ps 1 --workers 2:4 --control "$CTL" --timeout 240 -- "$BIN/mnist_replica" --all_reduce --elastic \
    --elastic_min_workers 2 --elastic_lr_scaling --train_steps 30000 --log_every 200 --quiet > "$OUT" 2>&1 &
LAUNCH=$!
PIDS+=($LAUNCH)
# wait_line PATTERN: up to 60 s for a line of the launch's output matching PATTERN.
wait_line() {
    for _ in $(seq 600); do grep -q -- "$1" "$OUT" && return 0; kill -0 "$LAUNCH" 2>/dev/null || break; sleep 0.1; done
    tail -n 30 "$OUT"
    fail "no line \"$1\" in dg-launch's output"
}
# A write to a FIFO nobody reads would block: a dg-launch gone is a failure, not a hang.
control() { timeout 10 bash -c 'echo "$1" > "$2"' _ "$1" "$CTL" || fail "could not write \"$1\" to the control FIFO"; }
wait_line "dg-launch: started; workers \[0,1\] (2, range 2..4)"
wait_line "\[worker0\] Training begins"
control add
wait_line "dg-launch: worker 2 added (pid [0-9]*); workers \[0,1,2\] (3, range 2..4)"
wait_line "elastic: /job:worker/task:2: epoch [0-9]* (joined): 3 members"
control "add 3"
wait_line "dg-launch: worker 3 added (pid [0-9]*); workers \[0,1,2,3\] (4, range 2..4)"
wait_line "elastic: /job:worker/task:3: epoch [0-9]* (joined): 4 members"
wait_line "^\[worker0\] .*training step .*learning rate 0.01$"   # 4 of 4 members: the whole rate
control "add"
wait_line "dg-launch: control: add: all 4 workers run"
control status
wait_line "dg-launch: status; workers \[0,1,2,3\] (4, range 2..4)"
control remove
wait_line "dg-launch: worker 3 removed (SIGTERM); workers \[0,1,2\] (3, range 2..4)"
wait_line "elastic coordinator elastic/worker: epoch [0-9]*: members \[0,1,2\]; new \[\]; left \[3\]"
control "remove 2"
wait_line "dg-launch: worker 2 removed (SIGTERM); workers \[0,1\] (2, range 2..4)"
wait_line "elastic coordinator elastic/worker: epoch [0-9]*: members \[0,1\]; new \[\]; left \[2\]"
control remove
wait_line "dg-launch: control: remove refused: 2 workers run, the least --workers allows is 2"
control "add 9"
wait_line "dg-launch: control: \"add 9\": expected add \[N\], remove \[N\] or status, N a worker in 0..3"
control "jump"
wait_line "dg-launch: control: unknown command \"jump\""
rc=0
timeout 240 tail --pid="$LAUNCH" -f /dev/null || fail "dg-launch still runs after 240 s"
wait "$LAUNCH" || rc=$?
grep "^dg-launch: worker\|^dg-launch: started\|removed)" "$OUT"
[ "$rc" -eq 0 ] || { tail -n 30 "$OUT"; fail "dg-launch exited with $rc"; }
[ ! -e "$CTL" ] || fail "the control FIFO was left behind"
a0=$(sed -n 's/^\[worker0\] Worker 0: validation accuracy = \([0-9.]*\) .*/\1/p' "$OUT")
a1=$(sed -n 's/^\[worker1\] Worker 1: validation accuracy = \([0-9.]*\) .*/\1/p' "$OUT")
check_ge "worker 0's test accuracy" "$a0" 0.80
[ "$a0" = "$a1" ] || fail "workers 0 and 1 end with other variables ($a0, $a1)"
# The learning rate on worker 0's progress lines, in order (--learning_rate's default: 0.01).
sed -n 's/^\[worker0\] .*training step .*learning rate \([0-9.e-]*\)$/\1/p' "$OUT" > "$TMP/lr"
first=$(head -1 "$TMP/lr")
last=$(tail -1 "$TMP/lr")
check_number "the first learning rate" "$first"
awk -v a="$first" 'BEGIN { exit !(a > 0.00499 && a < 0.00501) }' || fail "2 of 4 members: learning rate $first, not 0.005"
awk -v a="$last" 'BEGIN { exit !(a > 0.00499 && a < 0.00501) }' || fail "back to 2 members: learning rate $last, not 0.005"
awk '$1 > 0.00999 && $1 < 0.01001 { found = 1 } END { exit !found }' "$TMP/lr" ||
    fail "4 of 4 members: no learning rate 0.01 ($(sort -u "$TMP/lr" | tr '\n' ' '))"
echo "learning rates seen: $(sort -u "$TMP/lr" | tr '\n' ' ')"
echo "PASS launch_worker_range (accuracy $a0)"
