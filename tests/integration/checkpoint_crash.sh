#!/usr/bin/env bash
# Crash safety of the checkpoint store: dg-ckpt-writer saves checkpoints (4 MiB and smaller
# variables, every byte a function of the step) in a loop and is killed with SIGKILL at 50
# random moments (0-200 ms after it starts). After every kill the file must open, and every
# checkpoint in it (the newest first) must restore bit-exactly as that step's bytes. The newest
# step must be the last one the writer reported saved, or the next one (killed after its commit
# but before the print): a committed save is never lost and a partial one never shows.
source "$(dirname "$0")/common.bash"
W="$BIN/dg-ckpt-writer"
[ -x "$W" ] || fail "$W is not built"
F="$TMP/ckpt.db"
KILLS=${KILLS:-50}

"$W" "$F" --steps 2 > "$TMP/first" 2>&1 || { cat "$TMP/first"; fail "the first writer failed"; }
last=$(awk '/^saved step/ { s = $3 } END { print s + 0 }' "$TMP/first")
[ "$last" -eq 2 ] || fail "the first writer saved up to step $last, expected 2"

in_flight=0   # kills after which the step being saved had committed but was not yet reported
start=$(date +%s.%N)
for i in $(seq "$KILLS"); do
    "$W" "$F" > "$TMP/out" 2> "$TMP/err" & pid=$!; PIDS+=($pid)
    sleep "$(printf '0.%03d' $((RANDOM % 201)))"
    kill -9 "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
    if [ -s "$TMP/err" ]; then cat "$TMP/err"; fail "kill $i: the writer reported an error"; fi
    printed=$(awk -v s="$last" '/^saved step/ { s = $3 } END { print s + 0 }' "$TMP/out")
    rc=0
    "$W" --verify "$F" > "$TMP/verify" 2>&1 || rc=$?
    if [ "$rc" -ne 0 ]; then
        cat "$TMP/verify"
        fail "kill $i: verify exited $rc (the writer had saved step $printed)"
    fi
    got=$(awk '/^verified step/ { print $3 }' "$TMP/verify")
    check_number "kill $i: the newest verified step" "$got"
    if [ "$got" -eq "$printed" ]; then
        :
    elif [ "$got" -eq $((printed + 1)) ]; then
        in_flight=$((in_flight + 1))
    else
        fail "kill $i: the newest checkpoint is step $got, the writer had saved step $printed"
    fi
    last=$got
done
end=$(date +%s.%N)
awk -v a="$start" -v b="$end" -v k="$KILLS" -v s="$last" -v f="$in_flight" 'BEGIN {
    printf "%d kills in %.1f s: every checkpoint restored bit-exactly; newest step %d; %d kills " \
           "landed between a commit and its report\n", k, b - a, s, f }'
echo "PASS checkpoint_crash"
