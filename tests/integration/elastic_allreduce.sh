#!/usr/bin/env bash
# Elastic all-reduce (mnist_replica --all_reduce --elastic, docs/ELASTIC.md), the short form of
# bench/elastic_chaos.sh: a coordinator (the ps task) and three workers; worker 2 is SIGKILLed
# mid-training and started again a second later, then worker 1 likewise. Checked against the
# programs' own timestamps and a fault-free run of the same job:
# - every process ends, with status 0, under a hard deadline, and the survivors never restart;
# - the survivors' next epoch begins within 1 s of each kill;
# - a restarted worker is in an epoch within 5 s of its start (0.4-1.2 s here; the process
#   loads Fashion-MNIST first, slower on a loaded CI machine; bench/elastic_chaos.sh measures
#   the 2 s bar of issue 32);
# - the final test accuracy is within 1 point of the fault-free run's, and every worker ends
#   with the same variables (the same test cross entropy);
# - a worker built from another model (cnn_replica) is refused, on its side and the
#   coordinator's, and the job goes on.
source "$(dirname "$0")/common.bash"
read -r PP P0 P1 P2 P3 <<< "$(free_ports 5)"
H="--ps_hosts 127.0.0.1:$PP --worker_hosts 127.0.0.1:$P0,127.0.0.1:$P1,127.0.0.1:$P2,127.0.0.1:$P3"
STEPS=8000   # the second restart comes near step 3500 at about 1000 steps/s, and takes 1-4 s
ARGS="--all_reduce --elastic --elastic_min_workers 3 --train_steps $STEPS --log_every 100 --quiet"
now() { date +%s.%N; }
start_worker() {   # start_worker I LOG: sets pid_of[I]
    "$BIN/mnist_replica" --job_name worker --task_index "$1" $H $ARGS > "$2" 2>&1 &
    pid_of[$1]=$!
    PIDS+=($!)
}
run_job() {   # run_job DIR KILLS: the coordinator and workers 0-2; KILLS=1 kills and restarts workers 2, then 1
    local dir=$1 kills=$2
    mkdir -p "$dir"
    "$BIN/mnist_replica" --job_name ps --task_index 0 $H --quiet > "$dir/ps" 2>&1 &
    local ps=$!
    PIDS+=($ps)
    declare -gA pid_of=()
    for i in 0 1 2; do start_worker "$i" "$dir/w$i"; done
    if [ "$kills" = 1 ]; then
        for victim in 2 1; do
            local at=$((victim == 2 ? 1000 : 2000))   # most of the job left: a restart takes ~1 s, 2-4 s loaded
            local seen
            seen=$(wait_step "$dir/w0" "$at" 600)
            [ -n "$seen" ] && [ "$seen" -ge "$at" ] || { tail -5 "$dir/w0"; fail "worker 0 did not reach step $at"; }
            kill -9 "${pid_of[$victim]}"
            now > "$dir/killed$victim"
            wait "${pid_of[$victim]}" 2>/dev/null || true
            echo "killed worker $victim at global step $seen"
            sleep 1
            now > "$dir/started$victim"
            start_worker "$victim" "$dir/w${victim}b"
            if [ "$victim" = 2 ]; then
                # A worker of another model asks to join as task 3: refused, and nothing else changes.
                timeout 60 "$BIN/cnn_replica" --job_name worker --task_index 3 $H --all_reduce --elastic \
                    --elastic_min_workers 3 --train_steps 10 --quiet > "$dir/other" 2>&1 &&
                    fail "cnn_replica joined an MNIST group: $(tail -3 "$dir/other")"
                grep -q "refused task 3: its variables" "$dir/other" || { cat "$dir/other"; fail "no refusal on the joiner's side"; }
                grep -q "refused task 3: its variables" "$dir/ps" || { cat "$dir/ps"; fail "no refusal on the coordinator's side"; }
            fi
        done
    fi
    local deadline=$((SECONDS + 240))
    for i in 0 1 2; do wait_ok "$deadline" "worker $i" "${pid_of[$i]}" "$dir"/w*; done
    kill "$ps" 2>/dev/null || true
    wait "$ps" 2>/dev/null || true   # its port is free for the next job
}
acc_of() { sed -n 's/^Worker [0-9]*: validation accuracy = \([0-9.]*\) .*/\1/p' "$1"; }
ce_of() { sed -n 's/^After [0-9]* training step(s), validation cross entropy = \([0-9.]*\)$/\1/p' "$1"; }
# The time of the first line after time T that matches PATTERN ("<unix time>: ..." lines).
first_after() { awk -v t="$2" -v p="$3" -F': ' 'index($0, p) && $1 + 0 >= t + 0 { print $1; exit }' "$1"; }

run_job "$TMP/plain" 0
ref=$(acc_of "$TMP/plain/w0")
check_number "the fault-free accuracy" "$ref"
echo "fault-free: accuracy $ref"

run_job "$TMP/chaos" 1
D=$TMP/chaos
for victim in 2 1; do
    killed=$(cat "$D/killed$victim")
    for s in 0 $((3 - victim)); do   # the survivors of this kill: worker 0 and the other one
        log="$D/w$s"
        [ "$s" = 2 ] && log="$D/w2b"
        # The survivors' next epoch: after a failed step ("after a failure"), or at their commit
        # when the victim died between its last step and the commit (its loss is reported there).
        resumed=$(first_after "$log" "$killed" "elastic: /job:worker/task:$s: epoch")
        check_number "worker $s's next epoch after worker $victim was killed" "$resumed"
        gap=$(awk -v a="$resumed" -v b="$killed" 'BEGIN { printf "%.3f", a - b }')
        echo "worker $victim killed: worker $s in its next epoch after $gap s"
        check_le "seconds from killing worker $victim to worker $s's next epoch" "$gap" 1.0
    done
    started=$(cat "$D/started$victim")
    joined=$(first_after "$D/w${victim}b" "$started" "(joined)")
    if [ -z "$joined" ]; then
        echo "--- the restarted worker $victim:"; tail -8 "$D/w${victim}b"
        echo "--- the coordinator:"; tail -6 "$D/ps"
        grep -q "job had ended" "$D/w${victim}b" &&
            fail "restarted worker $victim came after the survivors had finished (the machine too slow for this job?)"
    fi
    check_number "restarted worker $victim's first epoch" "$joined"
    gap=$(awk -v a="$joined" -v b="$started" 'BEGIN { printf "%.3f", a - b }')
    echo "worker $victim restarted: in an epoch after $gap s"
    check_le "seconds from starting worker $victim again to its first epoch" "$gap" 5.0
done
# The survivors never restarted: one "Training begins" each (a recovery recreates the session
# in the same process).
for f in w0; do
    [ "$(grep -c '^Training begins' "$D/$f")" = 1 ] || fail "$f began training more than once"
done
grep -q "rolled back to the commit" "$D/w0" || fail "worker 0 never rolled back"
acc=$(acc_of "$D/w0")
ce0=$(ce_of "$D/w0")
check_number "worker 0's test cross entropy" "$ce0"
for f in w1b w2b; do
    [ "$(ce_of "$D/$f")" = "$ce0" ] || fail "$f ends with other variables than worker 0 ($(ce_of "$D/$f") vs $ce0)"
done
echo "with kills: accuracy $acc (fault-free $ref); $(grep '^Elastic:' "$D/w0")"
# One run each: the restarted workers see other batches than the fault-free run, which moves the
# accuracy at this length: 0.8676-0.8789 in 5 runs against 0.8786 fault-free; the long form,
# bench/elastic_chaos.sh, compares means of longer runs with the 1-point bar.
check_le "the accuracy lost to the kills" "$(awk -v a="$acc" -v r="$ref" 'BEGIN { printf "%.4f", r - a }')" 0.02
echo "PASS elastic_allreduce"
