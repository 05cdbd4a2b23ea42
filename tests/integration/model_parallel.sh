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
    awk -v mode="$mode" '
        $2 == "step" && NF == 5 {
            for (i = 4; i <= 5; i++)
                if ($i !~ /^-?[0-9]+\.[0-9]+$/) { print "FAIL: mode " mode ": loss \"" $i "\" at step " $3 " is not finite"; bad = 1 }
            if (n == 0) first = $4; last = $4; n++
        }
        END {
            if (bad) exit 1
            if (n < 2) { print "FAIL: mode " mode ": no loss table"; exit 1 }
            if (!(last + 0 < first + 0)) { print "FAIL: mode " mode ": the loss did not fall (" first " -> " last ")"; exit 1 }
            printf "mode %s: loss %s -> %s, all finite\n", mode, first, last
        }' "$TMP/$mode"
done
echo "PASS model_parallel"
