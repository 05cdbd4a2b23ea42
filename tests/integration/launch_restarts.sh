#!/usr/bin/env bash
# dg-launch as a supervisor (--max_restarts): elastic all-reduce under dg-launch (keys by
# default); worker 2 is SIGKILLed while it trains. dg-launch says so on one line, starts it
# again on the same task, and the job ends with status 0: every worker, the restarted one too,
# prints its accuracy, with the same variables (the same test cross entropy). Then a task that
# keeps failing exhausts its restarts and dg-launch stops everything with status 1.
source "$(dirname "$0")/common.bash"
"$BIN/dg-launch" --ps 1 --workers 3 --max_restarts 2 --timeout 300 -- "$BIN/mnist_replica" --all_reduce --elastic \
    --train_steps 8000 --log_every 200 --quiet > "$TMP/out" 2> "$TMP/err" & L=$!; PIDS+=($L)
for _ in $(seq 300); do grep -q "^\[worker2\] .*training step" "$TMP/out" && break; sleep 0.1; done
grep -q "^\[worker2\] .*training step" "$TMP/out" || { cat "$TMP/out" "$TMP/err"; fail "worker 2 never trained"; }
W2=$(pgrep -P "$L" -f -- "--task_index 2" | head -1)   # dg-launch's own child: other tests run beside
[ -n "$W2" ] || fail "no worker 2 process"
kill -9 "$W2"
rc=0
wait "$L" || rc=$?
cat "$TMP/err"
[ "$rc" = 0 ] || { tail -20 "$TMP/out"; fail "dg-launch exited with $rc"; }
grep -q "worker 2 killed by signal 9; starting it again in 0.5 s (restart 1 of 2)" "$TMP/err" ||
    fail "no restart line for worker 2"
grep -q "worker 2 started again" "$TMP/err" || fail "worker 2 was not started again"
grep -q "^\[worker2\] .*epoch [0-9]* (joined)" "$TMP/out" || fail "the restarted worker 2 joined no epoch"
ce=""
for w in 0 1 2; do
    c=$(sed -n "s/^\[worker$w\] After [0-9]* training step(s), validation cross entropy = \([0-9.]*\)$/\1/p" "$TMP/out" | tail -1)
    check_number "worker $w's test cross entropy" "$c"
    [ -z "$ce" ] || [ "$c" = "$ce" ] || fail "worker $w ends with other variables ($c vs $ce)"
    ce=$c
done
echo "all three workers end at test cross entropy $ce"
# A worker that fails every time: two restarts, then everything stops.
rc=0
"$BIN/dg-launch" --workers 2 --max_restarts 2 --timeout 120 -- "$BIN/mnist_replica" --all_reduce \
    --data_dir /nonexistent > "$TMP/out2" 2> "$TMP/err2" || rc=$?
cat "$TMP/err2"
[ "$rc" = 1 ] || fail "dg-launch exited with $rc for a task that always fails, expected 1"
grep -q "restart 2 of 2" "$TMP/err2" || fail "fewer than 2 restarts"
grep -q "(no restarts left)" "$TMP/err2" || fail "no line saying the restarts are used up"
echo "PASS launch_restarts"
