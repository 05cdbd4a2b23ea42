#!/usr/bin/env bash
# The model-parallel examples (layers split across two tasks; hidden units split in halves)
# train in step with their single-process versions: the loss curves agree (the example's own
# verdict), and, checked here independently of it, every loss is finite and the loss falls.
source "$(dirname "$0")/common.bash"
for mode in layers units; do
    "$BIN/dg-launch" --ps 1 --workers 1 --timeout 180 -- "$BIN/model_parallel" --mode "$mode" --train_steps 300 \
        --quiet > "$TMP/$mode" 2>&1 || { cat "$TMP/$mode"; fail "model_parallel --mode $mode failed"; }
    grep -E "step|difference|match" "$TMP/$mode" | tail -4
    grep -q "curves match: yes" "$TMP/$mode" || fail "mode $mode: curves differ"
    check_loss_table "$TMP/$mode" "mode $mode" 4 5   # "[worker0] step N distributed single"
done
echo "PASS model_parallel"
