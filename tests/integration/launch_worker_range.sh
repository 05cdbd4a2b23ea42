#!/usr/bin/env bash
# dg-launch --workers MIN:MAX --control FIFO with an elastic all-reduce job (mnist_replica
# --all_reduce --elastic; the coordinator on the ps task): workers 0 and 1 start; "add" and
# "add 3" through the FIFO start workers 2 and 3, which join the group; "remove" and "remove 2"
# stop them again (SIGTERM), and the group goes on with 0 and 1. Each change is one dg-launch
# line naming the workers running; a remove below MIN, a bad command and a worker out of range
# are refused with a message; the job ends with status 0, both workers with the same test
# accuracy, and the FIFO is removed.
source "$(dirname "$0")/common.bash"
CTL="$TMP/control"
OUT="$TMP/out"
"$BIN/dg-launch" --ps 1 --workers 2:4 --control "$CTL" --timeout 240 -- "$BIN/mnist_replica" --all_reduce --elastic \
    --elastic_min_workers 2 --train_steps 30000 --log_every 1000 --quiet > "$OUT" 2>&1 &
LAUNCH=$!
PIDS+=($LAUNCH)
# wait_line PATTERN: up to 60 s for a line of the launch's output matching PATTERN.
wait_line() {
    for _ in $(seq 600); do grep -q -- "$1" "$OUT" && return 0; kill -0 "$LAUNCH" 2>/dev/null || break; sleep 0.1; done
    tail -n 30 "$OUT"
    fail "no line \"$1\" in dg-launch's output"
}
control() { echo "$1" > "$CTL"; }
wait_line "dg-launch: started; workers \[0,1\] (2, range 2..4)"
wait_line "\[worker0\] Training begins"
control add
wait_line "dg-launch: worker 2 added (pid [0-9]*); workers \[0,1,2\] (3, range 2..4)"
wait_line "elastic: /job:worker/task:2: epoch [0-9]* (joined): 3 members"
control "add 3"
wait_line "dg-launch: worker 3 added (pid [0-9]*); workers \[0,1,2,3\] (4, range 2..4)"
wait_line "elastic: /job:worker/task:3: epoch [0-9]* (joined): 4 members"
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
echo "PASS launch_worker_range (accuracy $a0)"
