#!/usr/bin/env bash
# auth_bench: what authentication (CurveZMQ, a key pair per task, dg-launch's default) costs.
#   training: MNIST-replica, 1 ps + 2 workers, STEPS global steps, dg-launch with its keys
#             (default) and with --no_auth, alternating, ROUNDS times each; the median rates
#             and their ratio (target: keys >= 0.9x of none).
#   transfer: transport_bench's 64 MiB push and echo bandwidth and 4 B round trip with and
#             without --auth, once through shared memory (same host, the default: only the
#             40-byte descriptors are encrypted) and once with DG_SHM=0 (every byte over TCP and
#             encrypted, as between hosts).
# JSON lines. MODES=training,transfer picks (default both). Needs build/bin (scripts/build.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
STEPS=${STEPS:-3000}
ROUNDS=${ROUNDS:-3}
MODES=${MODES:-training,transfer}
BIN=build/bin
source bench/lib.bash

if [[ ",$MODES," == *,training,* ]]; then
    : > "$TMP/keys"
    : > "$TMP/none"
    for r in $(seq "$ROUNDS"); do
        for mode in keys none; do
            flag=$([ $mode = none ] && echo --no_auth || true)
            # shellcheck disable=SC2086
            env -u DG_KEY_DIR -u DG_CURVE_PUBLIC_KEY -u DG_CURVE_SECRET_KEY "$BIN/dg-launch" --ps 1 --workers 2 \
                --timeout 600 $flag -- "$BIN/mnist_replica" --train_steps "$STEPS" --quiet --log_every 1000000 \
                > "$TMP/log_$mode" 2>&1 || { cat "$TMP/log_$mode"; exit 1; }
            v=$(rate "$TMP/log_$mode")
            echo "$v" >> "$TMP/$mode"
            echo "{\"bench\": \"auth_bench\", \"round\": $r, \"auth\": \"$mode\", \"metric\": \"global_steps_per_s\", \"value\": $v, \"ps\": 1, \"workers\": 2, \"steps\": $STEPS}"
        done
    done
    k=$(median < "$TMP/keys")
    n=$(median < "$TMP/none")
    echo "{\"bench\": \"auth_bench\", \"metric\": \"global_steps_per_s_median\", \"keys\": $k, \"none\": $n, \"unit\": \"steps/s\", \"rounds\": $ROUNDS}"
    awk -v k="$k" -v n="$n" 'BEGIN { printf "{\"bench\": \"auth_bench\", \"metric\": \"keys_over_none\", \"value\": %.3f, \"unit\": \"x\", \"target\": 0.9}\n", k / n }'
fi

if [[ ",$MODES," == *,transfer,* ]]; then
    for shm in 1 0; do
        for a in "" --auth; do
            DG_SHM=$shm "$BIN/transport_bench" $a --skip_iperf --iters 500 --port $((20000 + RANDOM % 10000)) 2>/dev/null |
                grep -E '"(rtt_median_4B|echo_bandwidth_64MiB|push_bandwidth_64MiB)"' |
                sed "s/}\$/, \"auth\": $([ -n "$a" ] && echo true || echo false), \"shared_memory\": $([ $shm = 1 ] && echo true || echo false)}/"
        done
    done
fi
