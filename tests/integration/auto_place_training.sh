#!/usr/bin/env bash
# examples/auto_place_train, a transformer with no device scope, trained with automatic
# placement and with the expert's manual split, on two tasks (dg-launch, 1 ps + 1 worker) and on
# two CPUs of one process (--local): every run exits 0, its loss is finite and falls, and the
# automatic placement trains the same numbers as the manual split (the first and last loss
# within 1e-4 relative: the same model on the same batches, summed in another order). The
# placement must use the devices it was given: the ops it prints add up to the step's, and the
# prediction is a finite positive time. Speed is bench/auto_place_e2e.sh's business, not this.
source "$(dirname "$0")/common.bash"
args=(--model transformer --layers 2 --length 32 --vocab 200 --units 64 --batch 4 --train_steps 8)
run() {   # run NAME WHERE PLACEMENT
    if [ "$2" = tasks ]; then
        "$BIN/dg-launch" --ps 1 --workers 1 --timeout 180 -- "$BIN/auto_place_train" "${args[@]}" --placement "$3" \
            --quiet > "$TMP/$1" 2>&1 || { cat "$TMP/$1"; fail "$1: auto_place_train exited non-zero"; }
    else
        "$BIN/auto_place_train" "${args[@]}" --local --placement "$3" > "$TMP/$1" 2>&1 \
            || { cat "$TMP/$1"; fail "$1: auto_place_train --local exited non-zero"; }
    fi
    grep -E "placement|ops:|loss:|step:" "$TMP/$1" | sed "s/^/$1: /"
    total=$(sed -n 's/.*: \([0-9]*\) ops a step.*/\1/p' "$TMP/$1")
    read -r a b < <(sed -n 's/.*ops: \([0-9]*\) on the [A-Za-z ]*, \([0-9]*\) on the .*/\1 \2/p' "$TMP/$1")
    check_number "$1: ops on the first device" "$a"
    check_number "$1: ops on the second device" "$b"
    # Fed placeholders are not placed: at most a handful fewer than the step's ops.
    [ $((a + b)) -le "$total" ] && [ $((a + b)) -ge $((total - 4)) ] || fail "$1: $a + $b placed ops, $total in the step"
    pred=$(sed -n 's/.*predicted \([0-9.]*\) ms.*/\1/p' "$TMP/$1")
    check_number "$1: predicted step" "$pred"
    awk -v p="$pred" 'BEGIN { exit !(p > 0) }' || fail "$1: predicted step $pred ms"
    first=$(sed -n 's/.*loss: first \([^,]*\),.*/\1/p' "$TMP/$1")
    last=$(sed -n 's/.*loss: first [^,]*, last \(.*\)$/\1/p' "$TMP/$1")
    check_number "$1: first loss" "$first"
    check_number "$1: last loss" "$last"
    awk -v f="$first" -v l="$last" 'BEGIN { exit !(l < f) }' || fail "$1: the loss did not fall ($first -> $last)"
    echo "$first $last" > "$TMP/$1.loss"
}
same_numbers() {   # same_numbers A B
    read -r fa la < "$TMP/$1.loss"
    read -r fb lb < "$TMP/$2.loss"
    for pair in "$fa $fb" "$la $lb"; do
        set -- $pair
        awk -v x="$1" -v y="$2" 'BEGIN { d = x - y; if (d < 0) d = -d; s = y < 0 ? -y : y; exit !(d <= 1e-4 * s) }' \
            || fail "automatic and manual placements train other numbers: $1 against $2"
    done
}
run tasks_manual tasks manual
run tasks_auto tasks auto
same_numbers tasks_auto tasks_manual
run local_manual local manual
run local_auto local auto
same_numbers local_auto local_manual
same_numbers local_auto tasks_manual
echo "PASS auto_place_training"
