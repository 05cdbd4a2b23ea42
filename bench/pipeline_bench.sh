#!/usr/bin/env bash
# pipeline_bench: gpt_replica's GPT (the CPU configuration, --n_layer LAYERS, batch BATCH) cut
# into pipeline stages, one process per stage on this machine (127.0.0.1; each process one
# intra-op thread), against the naive split of the same model (the same stages, one
# micro-batch: one stage computes while the other waits) and against PyTorch's pipeline of the
# same model and schedule (bench/peers/torch_gpt_pipeline.py, when PyTorch imports). For each
# run: steps/s over STEPS steps after WARM, the bubble measured from a traced step
# (bench/pipeline_bubble.py) beside the closed form of the schedule, and each stage's peak
# tensor memory beyond what it holds after training (the activations; dg_tensor_memory: stage 0
# prints its own, dg-inspect server gives the others'). Each run is taken ROUNDS times (default 3)
# and the medians reported; with at least as many cores as stages each process is pinned to a
# core of its own (taskset; PIN=0: not). Then (EQUAL=1, the default) the same schedules at p = 2
# on bench/pipeline_mlp.c's equal stages, where the closed form of the bubble holds: a stage of
# the GPT is not equal to another (the first embeds, the last holds the output projection and
# the loss). JSON lines.
#   bench/pipeline_bench.sh                 # p = 2, m = 8, every schedule; then p = 4; equal stages
#   STAGES="2" SCHEDULES="1f1b" EQUAL=0 bench/pipeline_bench.sh
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${DG_BIN_DIR:-build/bin}
STEPS=${STEPS:-30}
WARM=${WARM:-10}
BATCH=${BATCH:-64}
M=${M:-8}
LAYERS=${LAYERS:-4}
STAGES=${STAGES:-"2 4"}
SCHEDULES=${SCHEDULES:-"gpipe 1f1b interleaved zb-h1"}
ROUNDS=${ROUNDS:-3}
PIN=${PIN:-1}
EQUAL=${EQUAL:-1}
PY=${PY:-/usr/bin/python3}   # the system Python, where Debian's PyTorch is
source bench/lib.bash
export DG_INTRA_OP_THREADS=1
cpu=$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -1)
cores=$(nproc)
echo "{\"bench\": \"pipeline_bench\", \"cpu\": \"$cpu\", \"cores\": $cores, \"kernels\": \"$(DG_INTRA_OP_THREADS=1 "$BIN/dg-inspect" cpu 2>/dev/null | head -1 | tr -d '"')\", \"batch\": $BATCH, \"layers\": $LAYERS, \"steps\": $STEPS}"

# theory SCHEDULE P M V: the bubble of the schedule's closed form (F = B = W).
theory() {
    awk -v s="$1" -v p="$2" -v m="$3" -v v="$4" 'BEGIN {
        if (s == "interleaved") b = ((p - 1) / v) / (m + (p - 1) / v)
        else if (s == "zb-h1") b = (p - 1) / (3 * m + p - 1)
        else b = (p - 1) / (m + p - 1)
        printf "%.4f", b }'
}

# once NAME P M SCHEDULE [FLAGS...]: one training run of P processes; writes NAME.rate (steps/s),
# NAME.bubble (the measured JSON) and NAME.mem (each stage's peak activation MiB).
once() {
    local name=$1 p=$2 m=$3 sch=$4
    shift 4
    local ports_line
    ports_line=$(ports "$p")
    read -r -a pt <<< "$ports_line"
    local ps="" k
    for ((k = 1; k < p; k++)); do ps+="${ps:+,}127.0.0.1:${pt[$k]}"; done
    local args=(--worker_hosts "127.0.0.1:${pt[0]}" --ps_hosts "$ps" --pipeline_stages "$p" --micro_batches "$m"
                --schedule "$sch" --batch_size "$BATCH" --n_layer "$LAYERS" --train_steps $((WARM + STEPS))
                --log_every 1 --eval_windows "$BATCH" --quiet --trace_step $((WARM - 1))
                --trace_file "$TMP/$name.json" "$@")
    local pin=()
    local pids=()
    for ((k = 1; k < p; k++)); do
        [ "$PIN" = 1 ] && [ "$cores" -ge "$p" ] && pin=(taskset -c "$k")
        "${pin[@]}" "$BIN/gpt_replica" "${args[@]}" --job_name ps --task_index $((k - 1)) > "$TMP/$name.ps$k" 2>&1 &
        pids+=($!)
        PIDS+=($!)
    done
    [ "$PIN" = 1 ] && [ "$cores" -ge "$p" ] && pin=(taskset -c 0)
    "${pin[@]}" "$BIN/gpt_replica" "${args[@]}" --job_name worker --task_index 0 > "$TMP/$name.w" 2>&1 ||
        { cat "$TMP/$name.w" >&2; exit 1; }
    local mem
    mem=$(sed -n 's/^Pipeline stage 0: tensor memory peak \([0-9.]*\) MiB, \([0-9.]*\) MiB alive.*/\1 \2/p' "$TMP/$name.w" |
          awk '{ printf "%.3f", $1 - $2 }')
    for ((k = 1; k < p; k++)); do
        "$BIN/dg-inspect" server "127.0.0.1:${pt[$k]}" > "$TMP/$name.c$k" 2>&1 || true
        kill "${pids[$((k - 1))]}" 2> /dev/null || true
        mem+=", $(awk '$1 == "tensor_bytes_peak" { p = $2 } $1 == "tensor_bytes" { l = $2 }
                       END { printf "%.3f", (p - l) / 1048576 }' "$TMP/$name.c$k")"
    done
    wait "${pids[@]}" 2> /dev/null || true
    awk -v a="$WARM" -v b=$((WARM + STEPS)) '
        / training step [0-9]+ done/ { for (i = 1; i <= NF; i++) if ($i == "step") n = $(i + 1); t[n] = $1 + 0 }
        END { printf "%.3f\n", (b - a) / (t[b] - t[a]) }' "$TMP/$name.w" > "$TMP/$name.rate"
    "$PY" bench/pipeline_bubble.py "$TMP/$name.json" $([ "$sch" = zb-h1 ] && echo --split_backward) > "$TMP/$name.bubble"
    echo "$mem" > "$TMP/$name.mem"
}

# once_equal NAME P M SCHEDULE [FLAGS...]: one run of pipeline_mlp's equal stages over P
# processes; writes NAME.rate, NAME.bubble and an empty NAME.mem (not measured there).
once_equal() {
    local name=$1 p=$2 m=$3 sch=$4
    shift 4
    local ports_line spec="" k
    ports_line=$(ports "$p")
    read -r -a pt <<< "$ports_line"
    for ((k = 0; k < p; k++)); do spec+="${spec:+,}127.0.0.1:${pt[$k]}"; done
    spec="pipeline|$spec"
    local pin=() pids=()
    for ((k = 1; k < p; k++)); do
        [ "$PIN" = 1 ] && [ "$cores" -ge "$p" ] && pin=(taskset -c "$k")
        "${pin[@]}" "$BIN/pipeline_mlp" --cluster "$spec" --task_index "$k" > "$TMP/$name.s$k" 2>&1 &
        pids+=($!)
        PIDS+=($!)
    done
    [ "$PIN" = 1 ] && [ "$cores" -ge "$p" ] && pin=(taskset -c 0)
    "${pin[@]}" "$BIN/pipeline_mlp" --cluster "$spec" --task_index 0 --schedule "$sch" --micro_batches "$m" \
        --steps "$STEPS" --warm "$WARM" --trace_file "$TMP/$name.json" "$@" > "$TMP/$name.out" 2> "$TMP/$name.err" ||
        { cat "$TMP/$name.err" >&2; exit 1; }
    kill "${pids[@]}" 2> /dev/null || true
    wait "${pids[@]}" 2> /dev/null || true
    "$PY" -c 'import json,sys; print("%.3f" % json.loads(sys.stdin.readlines()[-1])["steps_per_s"])' \
        < "$TMP/$name.out" > "$TMP/$name.rate"
    "$PY" bench/pipeline_bubble.py "$TMP/$name.json" $([ "$sch" = zb-h1 ] && echo --split_backward) > "$TMP/$name.bubble"
    : > "$TMP/$name.mem"
}

# run NAME P M SCHEDULE [FLAGS...]: ROUNDS runs (of ONCE: once, or once_equal); one JSON line
# of the medians (the bubble's run is the one of the median bubble); NAME.rate holds the
# median steps/s.
ONCE=once
run() {
    local name=$1 p=$2 m=$3 sch=$4 r
    shift 4
    : > "$TMP/$name.rates"
    : > "$TMP/$name.bubbles"
    for ((r = 0; r < ROUNDS; r++)); do
        "$ONCE" "$name.$r" "$p" "$m" "$sch" "$@"
        cat "$TMP/$name.$r.rate" >> "$TMP/$name.rates"
        echo "$("$PY" -c 'import json,sys; print(json.load(sys.stdin)["bubble"])' < "$TMP/$name.$r.bubble") $r" >> "$TMP/$name.bubbles"
    done
    local rate mid v=1
    rate=$(median < "$TMP/$name.rates")
    mid=$(sort -n "$TMP/$name.bubbles" | awk -v n="$ROUNDS" 'NR == int((n + 1) / 2) { print $2 }')
    [ "$sch" = interleaved ] && v=2
    echo "{\"bench\": \"pipeline_bench\", \"model\": \"$([ "$ONCE" = once ] && echo gpt || echo equal_stages)\", \"run\": \"$name\", \"stages\": $p, \"micro_batches\": $m, \"schedule\": \"$sch\", \"flags\": \"$*\", \"rounds\": $ROUNDS, \"pinned\": $([ "$PIN" = 1 ] && [ "$cores" -ge "$p" ] && echo true || echo false), \"steps_per_s\": $rate, \"steps_per_s_rounds\": [$(paste -sd, "$TMP/$name.rates")], \"bubble_theory\": $(theory "$sch" "$p" "$m" "$v"), \"bubble_rounds\": [$(cut -d' ' -f1 "$TMP/$name.bubbles" | paste -sd,)], \"measured\": $(cat "$TMP/$name.$mid.bubble"), \"peak_activation_mib\": [$(cat "$TMP/$name.$mid.mem")]}"
    echo "$rate" > "$TMP/$name.rate"
}

for p in $STAGES; do
    run "naive_p$p" "$p" 1 gpipe
    naive=$(cat "$TMP/naive_p$p.rate")
    for sch in $SCHEDULES; do
        [ "$sch" = interleaved ] && [ $((LAYERS % (2 * p))) -ne 0 ] && continue
        run "${sch}_p${p}" "$p" "$M" "$sch"
        echo "{\"bench\": \"pipeline_bench\", \"metric\": \"speedup_over_naive\", \"stages\": $p, \"schedule\": \"$sch\", \"micro_batches\": $M, \"value\": $(awk -v a="$(cat "$TMP/${sch}_p${p}.rate")" -v b="$naive" 'BEGIN { printf "%.3f", a / b }'), \"ideal\": $(awk -v p="$p" -v m="$M" 'BEGIN { printf "%.3f", p * m / (m + p - 1) }')}"
    done
    if [ "$p" -eq 2 ]; then
        run "gpipe_recompute_p$p" "$p" "$M" gpipe --recompute
        run "1f1b_recompute_p$p" "$p" "$M" 1f1b --recompute
    fi
done

# Equal stages (pipeline_mlp: 4 dense layers of 256 units a device, batch 4096), p = 2, m = M:
# the bubble against the closed form where the closed form holds, and the speed-up.
if [ "$EQUAL" = 1 ]; then
    ONCE=once_equal
    run equal_naive_p2 2 1 gpipe
    naive=$(cat "$TMP/equal_naive_p2.rate")
    for sch in $SCHEDULES; do
        run "equal_${sch}_p2" 2 "$M" "$sch"
        echo "{\"bench\": \"pipeline_bench\", \"model\": \"equal_stages\", \"metric\": \"speedup_over_naive\", \"stages\": 2, \"schedule\": \"$sch\", \"micro_batches\": $M, \"value\": $(awk -v a="$(cat "$TMP/equal_${sch}_p2.rate")" -v b="$naive" 'BEGIN { printf "%.3f", a / b }'), \"ideal\": $(awk -v m="$M" 'BEGIN { printf "%.3f", 2 * m / (m + 1) }')}"
    done
    ONCE=once
fi

# PyTorch's pipeline of the same model and schedule (1F1B), p = 2.
if "$PY" -c 'import torch' 2> /dev/null; then
    for sch in 1f1b gpipe; do
        "$PY" bench/peers/torch_gpt_pipeline.py --stages 2 --micro_batches "$M" --schedule "$sch" --batch "$BATCH" \
            --n_layer "$LAYERS" --steps "$STEPS" --warm "$WARM" --threads 1 > "$TMP/torch_$sch" 2>&1 ||
            { cat "$TMP/torch_$sch" >&2; exit 1; }
        tail -1 "$TMP/torch_$sch"
        t=$(python3 -c 'import json,sys; print(json.loads(sys.stdin.readlines()[-1])["steps_per_s"])' < "$TMP/torch_$sch")
        [ -f "$TMP/${sch}_p2.rate" ] &&
            echo "{\"bench\": \"pipeline_bench\", \"metric\": \"speed_over_torch\", \"stages\": 2, \"schedule\": \"$sch\", \"micro_batches\": $M, \"value\": $(awk -v a="$(cat "$TMP/${sch}_p2.rate")" -v b="$t" 'BEGIN { printf "%.3f", a / b }'), \"torch_steps_per_s\": $t}"
    done
else
    echo "{\"bench\": \"pipeline_bench\", \"metric\": \"speed_over_torch\", \"skipped\": \"PyTorch does not import (apt-get install python3-torch)\"}"
fi
