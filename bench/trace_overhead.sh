#!/usr/bin/env bash
# trace_overhead: what step tracing costs while it is off. MNIST-replica, 1 ps + 2 workers,
# STEPS global steps, with this tree (tracing built in, no --trace_step) and with BASE, the last
# commit before step tracing; ROUNDS rounds, the two builds taking turns (each going first in
# every other round: the second run of a pair tends to be slower) so that drift of the machine
# hits both alike. Both are built here the same way (RelWithDebInfo, no CUDA, into $TMP). JSON
# lines: each run, then each build's median and the median over the rounds of the round's ratio
# this/base (1.0: no cost; pairing the runs of a round cancels the machine's drift).
# Also one run with --trace_step, to show a traced step is one step: the rate is unchanged.
set -euo pipefail
cd "$(dirname "$0")/.."
STEPS=${STEPS:-3000}
ROUNDS=${ROUNDS:-9}
BASE=${BASE:-f8fc4f5}   # the last commit without step tracing
source bench/lib.bash
build() {   # build SRC DIR
    cmake -S "$1" -B "$2" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DDG_WITH_CUDA=OFF -DDG_BUILD_TESTS=OFF >/dev/null
    cmake --build "$2" -j"$(nproc)" --target mnist_replica dg-launch >/dev/null
}
echo "trace_overhead: building $BASE and this tree (a few minutes)" >&2
root=$PWD
git worktree add -q --detach "$TMP/base" "$BASE"
trap 'git -C "$root" worktree remove --force "$TMP/base" 2>/dev/null || true; bench_cleanup' EXIT
build "$TMP/base" "$TMP/base-build"
build . "$TMP/new-build"
run() {   # run NAME BIN [FLAGS...]: one training run, its JSON line
    local name=$1 bin=$2
    shift 2
    "$bin/dg-launch" --ps 1 --workers 2 --timeout 600 --no_auth -- "$bin/mnist_replica" --train_steps "$STEPS" \
        --quiet --log_every 1000000 "$@" > "$TMP/log" 2>&1 || { cat "$TMP/log" >&2; exit 1; }
    local r
    r=$(rate "$TMP/log")
    echo "$r" >> "$TMP/$name.rates"
    echo "{\"bench\": \"trace_overhead\", \"build\": \"$name\", \"metric\": \"global_steps_per_s\", \"value\": $r, \"unit\": \"steps/s\", \"ps\": 1, \"workers\": 2, \"steps\": $STEPS}"
}
cd "$TMP"
for round in $(seq "$ROUNDS"); do   # who goes first alternates, so order effects cancel too
    if [ $((round % 2)) = 1 ]; then
        run base "$TMP/base-build/bin"
        run tracing_off "$TMP/new-build/bin"
    else
        run tracing_off "$TMP/new-build/bin"
        run base "$TMP/base-build/bin"
    fi
    awk -v a="$(tail -1 tracing_off.rates)" -v b="$(tail -1 base.rates)" 'BEGIN { print a / b }' >> ratios
done
run tracing_one_step "$TMP/new-build/bin" --trace_step 500
b=$(median < base.rates)
n=$(median < tracing_off.rates)
for x in "base $b" "tracing_off $n"; do
    set -- $x
    echo "{\"bench\": \"trace_overhead\", \"build\": \"$1\", \"metric\": \"median_global_steps_per_s\", \"value\": $2, \"unit\": \"steps/s\", \"rounds\": $ROUNDS}"
done
r=$(median < ratios)
echo "{\"bench\": \"trace_overhead\", \"metric\": \"tracing_off_over_base\", \"value\": $r, \"unit\": \"x\", \"statistic\": \"median of the rounds' paired ratios\", \"ratios\": \"$(tr '\n' ' ' < ratios)\"}"
