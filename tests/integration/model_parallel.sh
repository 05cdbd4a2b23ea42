#!/usr/bin/env bash
# The model-parallel examples (layers split across two tasks; hidden units split in halves)
# train in step with their single-process versions: the loss curves agree, every loss is finite
# and the loss falls. The example exits 3 when its curves differ (dg-launch then fails); checked
# here again on the numbers it prints, not on its verdict line: the two curves row by row (1e-5
# relative, the example's tolerance for float32) and the largest relative difference it reports.
source "$(dirname "$0")/common.bash"
for mode in layers units; do
    "$BIN/dg-launch" --ps 1 --workers 1 --timeout 180 -- "$BIN/model_parallel" --mode "$mode" --train_steps 300 \
        --quiet > "$TMP/$mode" 2>&1 || { cat "$TMP/$mode"; fail "model_parallel --mode $mode failed"; }
    grep -E "step|difference|match" "$TMP/$mode" | tail -4
    check_loss_table "$TMP/$mode" "mode $mode" 4 5 1e-5   # "[worker0] step N distributed single"
    rel=$(sed -n 's/^\[worker0\] largest relative loss difference: //p' "$TMP/$mode")
    check_le "mode $mode: largest relative loss difference" "$rel" 1e-5
done
echo "PASS model_parallel"
