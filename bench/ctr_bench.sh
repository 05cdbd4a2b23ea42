#!/usr/bin/env bash
# The sharded embedding table of examples/ctr_replica.c, 2 workers, asynchronous, in one run:
#  - bytes per step: each worker traces one step (batch 256) and reports the bytes it sent each
#    way beside the rows its batch touched x the row size, for tables of 10^5, 10^6 and 4 x 10^6
#    rows (the bytes must not grow with the table; target: within 2x of the rows touched);
#  - training speed: global steps/s with the 10^6-row table on 1, 2 and 4 ps tasks (one part
#    per ps), at batch 4096 (STEPS_BIG global steps, default 400) and at batch 256 (STEPS,
#    default 3000). All tasks share this host's cores: at batch 256 a step is a millisecond of
#    messages, and each shard adds its own messages without adding a core.
# Prints JSON lines.
set -euo pipefail
cd "$(dirname "$0")/.."
STEPS=${STEPS:-3000}
STEPS_BIG=${STEPS_BIG:-400}
TMPD=$(mktemp -d)
trap 'rm -rf "$TMPD"' EXIT
run() {   # run PS ROWS BATCH STEPS [flags]: the training log in $TMPD/log
    local ps=$1 rows=$2 batch=$3 steps=$4
    shift 4
    build/bin/dg-launch --ps "$ps" --workers 2 --timeout 600 -- build/bin/ctr_replica --quiet --train_steps "$steps" \
        --table_rows "$rows" --batch_size "$batch" --test_examples 2000 --log_every 1000000 "$@" > "$TMPD/log" 2>&1 ||
        { cat "$TMPD/log"; exit 1; }
}
for rows in 100000 1000000 4000000; do
    run 2 "$rows" 256 "$STEPS" --report_bytes_step 50
    grep '"bench": "ctr_bytes"' "$TMPD/log" | sed 's/^\[worker[0-9]*\] //'
done
for batch in 4096 256; do
    steps=$STEPS
    [ "$batch" = 4096 ] && steps=$STEPS_BIG
    for ps in 1 2 4; do
        run "$ps" 1000000 "$batch" "$steps"
        # Global steps/s: the global steps over the slower worker's time.
        awk -v ps="$ps" -v steps="$steps" -v batch="$batch" '
            /local steps in/ { for (i = 1; i <= NF; i++) if ($i == "in") t = $(i + 1); if (t > max) max = t }
            END { printf "{\"bench\": \"ctr_steps\", \"ps_tasks\": %d, \"table_rows\": 1000000, \"batch\": %d, " \
                         "\"global_steps\": %d, \"seconds\": %.2f, \"global_steps_per_s\": %.1f}\n",
                         ps, batch, steps, max, steps / max }' "$TMPD/log"
    done
done
