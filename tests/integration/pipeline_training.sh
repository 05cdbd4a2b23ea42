#!/usr/bin/env bash
# gpt_replica --pipeline_stages 2: the GPT cut into two stages, one process each (the worker
# stage 0 and the client, the ps stage 1), trained on the same batches as the same model in one
# process. 500 steps of 1F1B with 4 micro-batches: every step's loss and the validation loss
# within 1e-4 of the one process's; 40 steps of each other schedule (GPipe, interleaved with 2 chunks,
# ZB-H1), of 1F1B with recomputation, and of two pipeline groups (data parallelism across 2
# pipelines of 2 stages, 4 processes): every step's loss within 1e-4. Tensor parallelism 1 way
# gives the same losses, 2 ways over a virtual CPU losses within 0.2. Then the stage process is
# killed mid-training: the client's step fails within 60 s naming stage 1 and its task (its
# first line says which task runs which stage), and nothing hangs. Tensor parallelism 2 ways
# over two tasks gives the losses of 2 ways over two CPUs of one process, and so do two stages
# that each split their blocks 2 ways; a pipeline in each of 2 workers under --all_reduce gives
# plain data parallelism's losses. 40 steps with the products in bfloat16 give one bfloat16
# process's losses within 1e-3.
source "$(dirname "$0")/common.bash"
COMMON=(--log_every 1 --eval_windows 48 --quiet --lr_end_step 500)
losses() { sed -n 's/.*training step \([0-9]*\) done (global step: [0-9]*), loss \(.*\)$/\1 \2/p' "$1"; }
val() { sed -n 's/.*After [0-9]* training step(s), validation loss = \([^ ]*\) .*/\1/p' "$1"; }
# same_losses REF GOT REL WHAT: every step's loss in GOT within REL (relative) of REF's (both
# "step loss" lines, step by step); prints the largest difference, fails naming WHAT.
same_losses() {
    paste "$1" "$2" | awk -v rel="$3" -v what="$4" '
        { d = ($2 - $4) / $2; if (d < 0) d = -d; if (!(d <= rel)) { print what " step " $1 ": " $2 " vs " $4; bad = 1 }
          if (d > m) m = d }
        END { printf "%s: %d steps, every loss within %.1e (relative)\n", what, NR, m; exit bad }' ||
        fail "$4: the losses differ"
}

# pipeline NAME STEPS FLAGS...: stage 1 on a ps task, stage 0 on the worker; waits for both.
pipeline() {
    local name=$1 steps=$2
    shift 2
    read -r PW PP <<< "$(free_ports 2)"
    local args=(--worker_hosts "127.0.0.1:$PW" --ps_hosts "127.0.0.1:$PP" --pipeline_stages 2 --train_steps "$steps"
                "${COMMON[@]}" "$@")
    "$BIN/gpt_replica" "${args[@]}" --job_name ps --task_index 0 > "$TMP/$name.ps" 2>&1 &
    local ps=$!
    PIDS+=($ps)
    "$BIN/gpt_replica" "${args[@]}" --job_name worker --task_index 0 > "$TMP/$name" 2>&1 & local w=$!
    PIDS+=($w)
    wait_ok $((SECONDS + 300)) "the pipelined client ($name)" "$w" "$TMP/$name" "$TMP/$name.ps"
    kill "$ps" 2>/dev/null || true
    wait "$ps" 2>/dev/null || true
}

# The reference: one process, 500 steps.
read -r P0 <<< "$(free_ports 1)"
"$BIN/gpt_replica" --worker_hosts "127.0.0.1:$P0" --job_name worker --task_index 0 --train_steps 500 "${COMMON[@]}" \
    > "$TMP/one" 2>&1 || { tail -20 "$TMP/one"; fail "gpt_replica (one process) failed"; }
losses "$TMP/one" > "$TMP/one.losses"
[ "$(wc -l < "$TMP/one.losses")" -eq 500 ] || fail "expected 500 loss lines from the one process"
while read -r _ l; do check_number "a step's loss" "$l"; done < "$TMP/one.losses"

pipeline 1f1b 500 --micro_batches 4 --schedule 1f1b
losses "$TMP/1f1b" > "$TMP/1f1b.losses"
[ "$(wc -l < "$TMP/1f1b.losses")" -eq 500 ] || { tail "$TMP/1f1b"; fail "expected 500 loss lines from the pipeline"; }
# Float sums in another order (the micro-batches' gradients added): measured within 5e-7
# relative over 500 steps.
paste "$TMP/one.losses" "$TMP/1f1b.losses" | awk '
    { d = ($2 - $4) / $2; if (d < 0) d = -d; if (!(d <= 1e-4)) { print "step " $1 ": " $2 " vs " $4; bad = 1 }
      if (d > m) m = d }
    END { printf "1F1B, 500 steps: every loss within %.1e (relative) of the one process'"'"'s\n", m; exit bad }' ||
    fail "the 1F1B pipeline's loss curve differs from the one process's"
v1=$(val "$TMP/one")
vp=$(val "$TMP/1f1b")
check_number "the one process's validation loss" "$v1"
check_number "the pipeline's validation loss" "$vp"
awk -v a="$v1" -v b="$vp" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(d <= 1e-4) }' ||
    fail "validation loss $vp after 500 pipelined steps, $v1 in one process"
check_le "the validation loss after 500 steps" "$vp" 3.0
echo "500 steps: validation loss $v1 in one process, $vp pipelined"

for run in "gpipe --micro_batches 4 --schedule gpipe" "interleaved --micro_batches 4 --schedule interleaved --chunks 2" \
           "zb-h1 --micro_batches 4 --schedule zb-h1" "recompute --micro_batches 2 --schedule 1f1b --recompute"; do
    read -r name flags <<< "$run"
    # shellcheck disable=SC2086
    pipeline "$name" 40 $flags
    losses "$TMP/$name" > "$TMP/$name.losses"
    [ "$(wc -l < "$TMP/$name.losses")" -eq 40 ] || { tail "$TMP/$name"; fail "$name: expected 40 loss lines"; }
    head -40 "$TMP/one.losses" | paste - "$TMP/$name.losses" | awk -v n="$name" '
        { d = $2 - $4; if (d < 0) d = -d; if (!(d <= 1e-4)) { print n " step " $1 ": " $2 " vs " $4; bad = 1 }
          if (d > m) m = d }
        END { printf "%s: 40 steps, every loss within %.1e of the one process'"'"'s\n", n, m; exit bad }' ||
        fail "$name: the losses differ from the one process's"
done

# against_one_process MP: 40 steps of a 1F1B pipeline (m = 4) with --mixed_precision MP against
# one process with the same: every loss within 1e-3 relative.
against_one_process() {
    local mp=$1
    read -r P0 <<< "$(free_ports 1)"
    "$BIN/gpt_replica" --worker_hosts "127.0.0.1:$P0" --job_name worker --task_index 0 --train_steps 40 \
        "${COMMON[@]}" --mixed_precision "$mp" > "$TMP/one_$mp" 2>&1 ||
        { tail -20 "$TMP/one_$mp"; fail "gpt_replica $mp (one process) failed"; }
    losses "$TMP/one_$mp" > "$TMP/one_$mp.losses"
    pipeline "$mp" 40 --micro_batches 4 --schedule 1f1b --mixed_precision "$mp"
    losses "$TMP/$mp" > "$TMP/$mp.losses"
    [ "$(wc -l < "$TMP/$mp.losses")" -eq 40 ] && [ "$(wc -l < "$TMP/one_$mp.losses")" -eq 40 ] ||
        { tail "$TMP/$mp"; fail "$mp: expected 40 loss lines from each"; }
    paste "$TMP/one_$mp.losses" "$TMP/$mp.losses" | awk -v n="$mp" '
        { d = ($2 - $4) / $2; if (d < 0) d = -d; if (!(d <= 1e-3)) { print n " step " $1 ": " $2 " vs " $4; bad = 1 }
          if (d > m) m = d }
        END { printf "%s 1F1B: 40 steps, every loss within %.1e (relative) of one %s process'"'"'s\n", n, m, n; exit bad }' ||
        fail "$mp: the pipeline's losses differ from one process's"
}

# Products in bfloat16 (--mixed_precision bf16): every micro-batch's gradient reaches the
# variables through the casts the first one made (before the fix only the first's did, and the
# losses left the one process's by 3% in 40 steps). A micro-batch's weight gradients are rounded
# on their own: measured within 3.2e-5 relative of one process in bfloat16.
against_one_process bf16
# Interleaved, in bfloat16: a chunk's first forward is not its device's first piece, and the
# validation pass (float32 products) must not wait on the schedule's casts.
pipeline bf16i 10 --micro_batches 4 --schedule interleaved --chunks 2 --mixed_precision bf16
check_number "bf16, interleaved: the validation loss" "$(val "$TMP/bf16i")"

# Products in float16 with dynamic loss scaling: every micro-batch's loss times the scale, the
# accumulated gradients unscaled and applied only when finite (measured within 5.2e-6 relative
# of one float16 process over 40 steps); a forced overflow skips its steps and halves the scale.
against_one_process fp16
grep -q "Loss scaling: scale 32768, 0 steps skipped" "$TMP/fp16" || { tail "$TMP/fp16"; fail "fp16: steps skipped without an overflow"; }
pipeline fp16o 16 --micro_batches 4 --schedule gpipe --mixed_precision fp16 --force_overflow_at 10
grep -q "Loss scaling: scale 4096, 3 steps skipped" "$TMP/fp16o" ||
    { grep -i "skipped\|scaling" "$TMP/fp16o" | tail; fail "fp16: a forced overflow in a pipeline did not skip 3 steps and divide the scale by 8"; }
echo "fp16 pipeline: a forced overflow skipped 3 steps, the scale 32768 -> 4096"

# Data parallelism across two pipelines of two stages (4 processes, each group half the batch,
# sharing the first group's variables): the same losses as one process.
read -r PW P1 P2 P3 <<< "$(free_ports 4)"
args=(--worker_hosts "127.0.0.1:$PW" --ps_hosts "127.0.0.1:$P1,127.0.0.1:$P2,127.0.0.1:$P3" --pipeline_stages 2
      --pipeline_groups 2 --micro_batches 2 --train_steps 40 "${COMMON[@]}")
gps=()
for t in 0 1 2; do
    "$BIN/gpt_replica" "${args[@]}" --job_name ps --task_index "$t" > "$TMP/groups.ps$t" 2>&1 &
    gps+=($!)
    PIDS+=($!)
done
"$BIN/gpt_replica" "${args[@]}" --job_name worker --task_index 0 > "$TMP/groups" 2>&1 & GW=$!
PIDS+=($GW)
wait_ok $((SECONDS + 300)) "the client of two pipeline groups" "$GW" "$TMP/groups"
kill "${gps[@]}" 2>/dev/null || true
grep -q "Pipeline group 1 of 2: .*stage 0 on /job:ps/task:1, stage 1 on /job:ps/task:2" "$TMP/groups" ||
    fail "the second group's stages are not on ps tasks 1 and 2"
losses "$TMP/groups" > "$TMP/groups.losses"
[ "$(wc -l < "$TMP/groups.losses")" -eq 40 ] || { tail "$TMP/groups"; fail "groups: expected 40 loss lines"; }
head -40 "$TMP/one.losses" | paste - "$TMP/groups.losses" | awk '
    { d = $2 - $4; if (d < 0) d = -d; if (!(d <= 1e-4)) { print "groups step " $1 ": " $2 " vs " $4; bad = 1 }
      if (d > m) m = d }
    END { printf "2 groups of 2 stages: 40 steps, every loss within %.1e of the one process'"'"'s\n", m; exit bad }' ||
    fail "two pipeline groups: the losses differ from the one process's"

# Tensor parallelism in one process: --tensor_parallel 1 draws the one shard as the unsplit
# model draws the matrix (the same losses); 2 ways over a virtual CPU trains as well (other
# shards, other draws: close, not equal).
for tp in 1 2; do
    read -r PT <<< "$(free_ports 1)"
    "$BIN/gpt_replica" --worker_hosts "127.0.0.1:$PT" --job_name worker --task_index 0 --train_steps 40 "${COMMON[@]}" \
        --tensor_parallel "$tp" --virtual_cpus $((tp - 1)) > "$TMP/tp$tp" 2>&1 & TPW=$!
    PIDS+=($TPW)
    wait_ok $((SECONDS + 300)) "gpt_replica --tensor_parallel $tp" "$TPW" "$TMP/tp$tp"
    losses "$TMP/tp$tp" > "$TMP/tp$tp.losses"
    [ "$(wc -l < "$TMP/tp$tp.losses")" -eq 40 ] || { tail "$TMP/tp$tp"; fail "tensor parallel $tp: expected 40 loss lines"; }
    check_number "tensor parallel $tp: the validation loss" "$(val "$TMP/tp$tp")"
done
grep -q "Tensor parallel over 2 devices: /job:worker/task:0/device:CPU:0, /job:worker/task:0/device:CPU:1" "$TMP/tp2" ||
    fail "tensor parallel 2: not on the worker's two CPU devices"
head -40 "$TMP/one.losses" | paste - "$TMP/tp1.losses" "$TMP/tp2.losses" | awk '
    { d = $2 - $4; if (d < 0) d = -d; if (!(d <= 1e-4)) { print "tp 1 step " $1 ": " $2 " vs " $4; bad = 1 }
      e = $2 - $6; if (e < 0) e = -e; if (!(e <= 0.2)) { print "tp 2 step " $1 ": " $2 " vs " $6; bad = 1 }
      if (e > m) m = e }
    END { printf "tensor parallel: 1 way as the unsplit model, 2 ways within %.3f of it over 40 steps\n", m; exit bad }' ||
    fail "tensor parallelism: the losses differ from the unsplit model's"

# Tensor parallelism across tasks (--tp_tasks): shard 0 on the worker, shard 1 on the ps task,
# the partial sums added on the worker and read back by the ps task: the same shards and the
# same sums in the same order as over two CPUs of one process, so the same losses.
read -r PW PP <<< "$(free_ports 2)"
args=(--worker_hosts "127.0.0.1:$PW" --ps_hosts "127.0.0.1:$PP" --tensor_parallel 2 --tp_tasks --train_steps 40 "${COMMON[@]}")
"$BIN/gpt_replica" "${args[@]}" --job_name ps --task_index 0 > "$TMP/tpt.ps" 2>&1 & TPP=$!
PIDS+=($TPP)
"$BIN/gpt_replica" "${args[@]}" --job_name worker --task_index 0 > "$TMP/tpt" 2>&1 & TPW=$!
PIDS+=($TPW)
wait_ok $((SECONDS + 300)) "gpt_replica --tensor_parallel 2 --tp_tasks" "$TPW" "$TMP/tpt" "$TMP/tpt.ps"
kill "$TPP" 2>/dev/null || true
grep -q "Tensor parallel over 2 devices: /job:worker/task:0/device:CPU:0, /job:ps/task:0/device:CPU:0" "$TMP/tpt" ||
    fail "tensor parallel over tasks: not on the worker's and the ps task's CPUs"
losses "$TMP/tpt" > "$TMP/tpt.losses"
[ "$(wc -l < "$TMP/tpt.losses")" -eq 40 ] || { tail "$TMP/tpt"; fail "tensor parallel over tasks: expected 40 loss lines"; }
same_losses "$TMP/tp2.losses" "$TMP/tpt.losses" 1e-6 "tensor parallel over 2 tasks against 2 CPUs of one process"

# Tensor parallelism inside pipeline stages: two stages (one process each), each splitting its
# blocks over the two CPUs of its process: the same shards and sums as 2 ways in one process,
# the micro-batches' gradients summed, so the same losses (within 1e-5 relative).
pipeline tp_pipe 40 --micro_batches 4 --tensor_parallel 2 --virtual_cpus 1
losses "$TMP/tp_pipe" > "$TMP/tp_pipe.losses"
[ "$(wc -l < "$TMP/tp_pipe.losses")" -eq 40 ] || { tail "$TMP/tp_pipe"; fail "tensor parallel stages: expected 40 loss lines"; }
same_losses "$TMP/tp2.losses" "$TMP/tp_pipe.losses" 1e-5 "2 stages, each 2 ways tensor parallel, against 2 ways in one process"

# Tensor parallelism inside each worker, data parallelism across 2 workers (--all_reduce):
# 1 way gives plain data parallelism's losses; 2 ways puts each worker's shards on its own CPUs,
# and both workers end with the same variables (the same validation loss), close to plain data
# parallelism's (other shards, other draws). With ps tasks it is refused.
for tp in 0 1 2; do
    extra=()
    [ "$tp" -gt 0 ] && extra=(--tensor_parallel "$tp" --virtual_cpus $((tp - 1)))
    "$BIN/dg-launch" --workers 2 --timeout 300 -- "$BIN/gpt_replica" --all_reduce --train_steps 40 "${COMMON[@]}" \
        "${extra[@]}" > "$TMP/dp$tp" 2>&1 || { tail -20 "$TMP/dp$tp"; fail "tensor parallel $tp with --all_reduce failed"; }
    for w in 0 1; do
        sed -n "s/^\[worker$w\] //p" "$TMP/dp$tp" > "$TMP/dp$tp.w$w"
        losses "$TMP/dp$tp.w$w" > "$TMP/dp$tp.w$w.losses"
        [ "$(wc -l < "$TMP/dp$tp.w$w.losses")" -eq 40 ] || fail "tp $tp + all-reduce: worker $w has not 40 loss lines"
        check_number "tp $tp + all-reduce: worker $w's validation loss" "$(val "$TMP/dp$tp.w$w")"
    done
    [ "$(val "$TMP/dp$tp.w0")" = "$(val "$TMP/dp$tp.w1")" ] ||
        fail "tp $tp + all-reduce: the workers' validation losses differ (their variables do)"
done
grep -q "^\[worker1\] Tensor parallel over 2 devices: /job:worker/task:1/device:CPU:0, /job:worker/task:1/device:CPU:1" \
    "$TMP/dp2" || fail "tp 2 + all-reduce: worker 1's shards are not on its own CPUs"
for w in 0 1; do
    cmp -s "$TMP/dp0.w$w.losses" "$TMP/dp1.w$w.losses" || fail "tp 1 + all-reduce: worker $w's losses are not plain data parallelism's"
done
v0=$(val "$TMP/dp0.w0")
v2=$(val "$TMP/dp2.w0")
awk -v a="$v0" -v b="$v2" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(d <= 0.1) }' ||
    fail "tp 2 + all-reduce: validation loss $v2, data parallelism alone $v0"
echo "tensor parallel inside workers, data parallel across 2: 1 way as data parallelism alone, 2 ways $v2 against $v0"

# A pipeline inside each worker, data parallelism across 2 workers (--all_reduce): each worker's
# two stages on its two CPUs, the micro-batches' gradients averaged over the workers: every
# loss of each worker within 1e-5 (relative) of plain data parallelism's, the same variables on
# both (the same validation loss). With --sync_replicas it is refused by name.
"$BIN/dg-launch" --workers 2 --timeout 300 -- "$BIN/gpt_replica" --all_reduce --pipeline_stages 2 --micro_batches 4 \
    --virtual_cpus 1 --train_steps 40 "${COMMON[@]}" > "$TMP/dpp" 2>&1 ||
    { tail -20 "$TMP/dpp"; fail "pipelines with --all_reduce failed"; }
grep -q "^\[worker1\] Pipeline of 2 stages, 4 micro-batches, 1f1b: stage 0 on /job:worker/task:1/device:CPU:0, stage 1 on /job:worker/task:1/device:CPU:1" \
    "$TMP/dpp" || fail "pipelines with --all_reduce: worker 1's stages are not on its own CPUs"
for w in 0 1; do
    sed -n "s/^\[worker$w\] //p" "$TMP/dpp" > "$TMP/dpp.w$w"
    losses "$TMP/dpp.w$w" > "$TMP/dpp.w$w.losses"
    [ "$(wc -l < "$TMP/dpp.w$w.losses")" -eq 40 ] || fail "pipelines + all-reduce: worker $w has not 40 loss lines"
    same_losses "$TMP/dp0.w$w.losses" "$TMP/dpp.w$w.losses" 1e-5 "pipelines + all-reduce, worker $w, against data parallelism alone"
done
[ "$(val "$TMP/dpp.w0")" = "$(val "$TMP/dpp.w1")" ] ||
    fail "pipelines + all-reduce: the workers' validation losses differ (their variables do)"
rc=0
"$BIN/dg-launch" --workers 2 --timeout 120 -- "$BIN/gpt_replica" --sync_replicas --pipeline_stages 2 --virtual_cpus 1 \
    --train_steps 1 --quiet > "$TMP/dpp_sync" 2>&1 || rc=$?
[ "$rc" -ne 0 ] && grep -q "without --sync_replicas or --elastic" "$TMP/dpp_sync" ||
    { tail "$TMP/dpp_sync"; fail "a pipeline with --sync_replicas ran"; }
read -r PW PP <<< "$(free_ports 2)"
rc=0
"$BIN/gpt_replica" --worker_hosts "127.0.0.1:$PW" --ps_hosts "127.0.0.1:$PP" --job_name worker --task_index 0 \
    --tensor_parallel 2 --virtual_cpus 1 --train_steps 1 --quiet > "$TMP/tp_ps" 2>&1 || rc=$?
[ "$rc" -ne 0 ] && grep -q "or with --tp_tasks" "$TMP/tp_ps" || { cat "$TMP/tp_ps"; fail "tensor parallelism with ps tasks ran"; }

# A stage killed mid-step: the client fails within 60 s naming stage 1 and its task, nothing hangs.
read -r PW PP <<< "$(free_ports 2)"
args=(--worker_hosts "127.0.0.1:$PW" --ps_hosts "127.0.0.1:$PP" --pipeline_stages 2 --micro_batches 4
      --train_steps 100000 --log_every 1 --quiet --rpc_timeout_ms 10000)
"$BIN/gpt_replica" "${args[@]}" --job_name ps --task_index 0 > "$TMP/kill.ps" 2>&1 & PS=$!
PIDS+=($PS)
"$BIN/gpt_replica" "${args[@]}" --job_name worker --task_index 0 > "$TMP/kill" 2>&1 & W=$!
PIDS+=($W)
s=$(wait_step "$TMP/kill" 20 1200)
[ -n "$s" ] && [ "$s" -ge 20 ] || { tail "$TMP/kill"; fail "the pipeline never reached step 20"; }
kill -9 "$PS"
start=$SECONDS
while kill -0 "$W" 2>/dev/null && [ $((SECONDS - start)) -lt 60 ]; do sleep 0.2; done
if kill -0 "$W" 2>/dev/null; then
    stacks "$W" "the client"
    tail -20 "$TMP/kill"
    fail "the client still runs 60 s after stage 1's process was killed"
fi
rc=0
wait "$W" || rc=$?
tail -3 "$TMP/kill"
[ "$rc" -ne 0 ] || fail "the client exited 0 although stage 1's process is gone"
grep -q "stage 1 on /job:ps/task:0" "$TMP/kill" || fail "the client does not say which task runs stage 1"
tail -1 "$TMP/kill" | grep -q "/job:ps/replica:0/task:0" || fail "the client's error does not name stage 1's task"
tail -1 "$TMP/kill" | grep -q "training step: UNAVAILABLE: pipeline stage 1 (on /job:ps/task:0): " ||
    fail "the client's error does not name stage 1"
echo "stage 1 killed after step $s: the client failed $((SECONDS - start)) s later, naming the stage and its task"
echo "PASS pipeline_training"
