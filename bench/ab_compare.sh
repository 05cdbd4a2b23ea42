#!/usr/bin/env bash
# ab_compare: is a change speed-neutral? The same benchmarks from two checkouts (each with its
# build/bin), taken alternately, ROUNDS rounds (default 5), on one machine in one run:
#   - the MLP training step, one thread (step_bench: median step, ms; the best of three runs);
#   - the transport between two processes (transport_bench: 4 B and 4 KiB round trips, us,
#     and 64 MiB push bandwidth, Gbit/s; no iperf3);
#   - MNIST-replica training through dg-launch: async, 1 ps + 2 workers, and all-reduce,
#     2 workers (global steps/s over STEPS steps, default 1500).
# Prints each round's figures and then, per figure, the median over rounds of the ratio
# after/before as a speed (above 1: the second checkout is faster), and the ratio of each
# side's best round (a virtual machine's slow spells, seconds long, only ever slow a side
# down, and can land on one side of a round), JSON lines.
#   bench/ab_compare.sh BEFORE_CHECKOUT AFTER_CHECKOUT
# A restructuring that must not change speed wants every speed ratio >= 0.97.
set -euo pipefail
[ $# -eq 2 ] || { echo "usage: $0 BEFORE_CHECKOUT AFTER_CHECKOUT (each built: build/bin)" >&2; exit 2; }
ROUNDS=${ROUNDS:-5}
STEPS=${STEPS:-1500}
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
for d in "$1" "$2"; do
    for p in step_bench transport_bench dg-launch mnist_replica; do
        [ -x "$d/build/bin/$p" ] || { echo "ab_compare: no $d/build/bin/$p (scripts/build.sh there)" >&2; exit 2; }
    done
done

num() {   # num FILE METRIC: the value of the JSON line of that metric
    sed -n "s/.*\"metric\": \"$2\", \"value\": \([0-9.e+-]*\).*/\1/p" "$1" | head -1
}

# train DIR MODE: global steps/s of mnist_replica in DIR, MODE async or allreduce.
train() {
    local dir=$1 mode=$2 ps=1 args=()
    if [ "$mode" = allreduce ]; then ps=0; args=(--all_reduce); fi
    (cd "$dir" && build/bin/dg-launch --ps "$ps" --workers 2 --timeout 600 -- build/bin/mnist_replica \
        --train_steps "$STEPS" --quiet --log_every 1000000 "${args[@]}") > "$TMP/train" 2>&1 ||
        { cat "$TMP/train" >&2; exit 1; }
    awk -v steps="$STEPS" '
        /Training begins @/ { b = $NF; if (!first || b < first) first = b }
        /Training ends @/ { e = $NF; if (e > last) last = e }
        END { if (last > first) printf "%.1f", steps / (last - first) }' "$TMP/train"
}

# one DIR SIDE ROUND: every figure of one checkout, one JSON line each, into $TMP/SIDE.
one() {
    local dir=$1 side=$2 round=$3 v
    # The step three times, the best kept: on a shared virtual machine a core runs at half speed
    # for seconds at a time, which only ever makes a step slower.
    for k in 1 2 3; do "$dir/build/bin/step_bench" --steps 1000 > "$TMP/step$k" 2>/dev/null; done
    best=1
    for k in 2 3; do
        if awk -v a="$(num "$TMP/step$k" median_step)" -v b="$(num "$TMP/step$best" median_step)" 'BEGIN { exit !(a < b) }'; then
            best=$k
        fi
    done
    cp "$TMP/step$best" "$TMP/step"
    "$dir/build/bin/transport_bench" --skip_iperf --iters 1000 --max_seconds 3 --rounds 3 --pushes 8 > "$TMP/tp" 2>/dev/null
    for m in "step:median_step:ms:time" "tp:rtt_median_4B:us:time" "tp:rtt_median_4KiB:us:time" \
             "tp:push_bandwidth_64MiB:Gbit/s:rate"; do
        IFS=: read -r file metric unit kind <<< "$m"
        v=$(num "$TMP/$file" "$metric")
        [ -n "$v" ] || { echo "ab_compare: $metric missing from $dir's output" >&2; cat "$TMP/$file" >&2; exit 1; }
        echo "{\"bench\": \"ab_compare\", \"side\": \"$side\", \"round\": $round, \"metric\": \"$metric\", \"value\": $v, \"unit\": \"$unit\", \"kind\": \"$kind\"}" | tee -a "$TMP/$side"
    done
    for mode in async allreduce; do
        v=$(train "$dir" "$mode")
        [ -n "$v" ] || { echo "ab_compare: no rate from $mode training in $dir" >&2; exit 1; }
        echo "{\"bench\": \"ab_compare\", \"side\": \"$side\", \"round\": $round, \"metric\": \"${mode}_global_steps_per_s\", \"value\": $v, \"unit\": \"steps/s\", \"kind\": \"rate\"}" | tee -a "$TMP/$side"
    done
}

echo "# ab_compare: before $(git -C "$1" rev-parse --short HEAD 2>/dev/null || echo "$1"), after $(git -C "$2" rev-parse --short HEAD 2>/dev/null || echo "$2"), $ROUNDS rounds, $(sed -n 's/^model name\s*: //p' /proc/cpuinfo | head -1), $(nproc) cores"
for r in $(seq "$ROUNDS"); do
    if [ $((r % 2)) -eq 1 ]; then one "$1" before "$r"; one "$2" after "$r"
    else one "$2" after "$r"; one "$1" before "$r"; fi
done
# Per metric: the ratio of each round, as a speed (time: before/after; rate: after/before).
python3 - "$TMP/before" "$TMP/after" <<'PY'
import json, statistics, sys
def load(p):
    out = {}
    for line in open(p):
        d = json.loads(line)
        out.setdefault(d["metric"], {})[d["round"]] = d
    return out
b, a = load(sys.argv[1]), load(sys.argv[2])
for m in b:
    rs = []
    for r, db in sorted(b[m].items()):
        da = a[m][r]
        x, y = float(db["value"]), float(da["value"])
        if x <= 0 or y <= 0 or x != x or y != y:
            sys.exit("ab_compare: %s round %d: not a positive number (%s, %s)" % (m, r, x, y))
        rs.append(x / y if db["kind"] == "time" else y / x)
    print(json.dumps({"bench": "ab_compare", "metric": m + "_speed_ratio", "value": round(statistics.median(rs), 3),
                      "unit": "after/before", "rounds": [round(v, 3) for v in rs]}))
    # The best of each side over all rounds (the fastest time, the highest rate): what each
    # does when the machine is not slowed, which the per-round ratios mix in.
    vb = [float(d["value"]) for d in b[m].values()]
    va = [float(d["value"]) for d in a[m].values()]
    best = min(vb) / min(va) if b[m][1]["kind"] == "time" else max(va) / max(vb)
    print(json.dumps({"bench": "ab_compare", "metric": m + "_best_speed_ratio", "value": round(best, 3),
                      "unit": "after/before"}))
PY
