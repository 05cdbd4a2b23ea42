#!/usr/bin/env bash
# gpt_replica, the byte-level GPT on Debian's fortunes: one process, then two workers by
# all-reduce, 60 steps each (of the default CPU configuration, batch 12). Every step's loss is
# a number; the first is the loss of uniform guesses over 256 bytes (ln 256 = 5.545) within
# 0.15 (the weights start at N(0, 0.02)); the validation loss after 60 steps is under 3.6 (runs
# measured 3.13-3.17: the model has learnt which bytes are common, and that is all 60 steps
# teach); under all-reduce both workers hold the same variables, so they print the same
# validation loss. gpt_sample then writes 100 bytes from the one-process checkpoint with its
# key/value cache (past the 64-byte context, so the cache restarts), the same bytes for the
# same seed. Last, the tied token embedding in 2 parts on 2 ps tasks (--wte_parts 2).
source "$(dirname "$0")/common.bash"
read -r P0 <<< "$(free_ports 1)"
"$BIN/gpt_replica" --worker_hosts "127.0.0.1:$P0" --job_name worker --task_index 0 --train_steps 60 --log_every 1 \
    --eval_windows 48 --quiet --checkpoint_path "$TMP/gpt.db" > "$TMP/one" 2>&1 ||
    { cat "$TMP/one"; fail "gpt_replica (one process) failed"; }
losses=$(sed -n 's/.*training step [0-9]* done (global step: [0-9]*), loss \(.*\)$/\1/p' "$TMP/one")
[ "$(echo "$losses" | wc -l)" -eq 60 ] || { cat "$TMP/one"; fail "expected 60 loss lines"; }
for l in $losses; do check_number "a step's loss" "$l"; done
first=$(echo "$losses" | head -1)
check_ge "the first loss" "$first" 5.395
check_le "the first loss" "$first" 5.695
val=$(sed -n 's/^After 60 training step(s), validation loss = \([^ ]*\) .*/\1/p' "$TMP/one")
check_le "the validation loss after 60 steps" "$val" 3.6
echo "one process: first loss $first, validation loss $val"
for r in a b; do
    "$BIN/gpt_sample" --checkpoint "$TMP/gpt.db" --prompt "The " --tokens 100 --seed 5 > "$TMP/sample_$r" \
        2> "$TMP/sample_$r.err" || { cat "$TMP/sample_$r.err"; fail "gpt_sample failed"; }
done
grep "checkpoint of global step 60; 100 new bytes" "$TMP/sample_a.err" || { cat "$TMP/sample_a.err"; fail "gpt_sample's summary"; }
bytes=$(wc -c < "$TMP/sample_a")
[ "$bytes" -eq 105 ] || fail "gpt_sample wrote $bytes bytes, expected the 4-byte prompt, 100 new bytes and a newline"
cmp -s "$TMP/sample_a" "$TMP/sample_b" || fail "gpt_sample wrote different text for the same seed"

"$BIN/dg-launch" --ps 0 --workers 2 --timeout 300 -- "$BIN/gpt_replica" --all_reduce --train_steps 60 --log_every 20 \
    --eval_windows 48 --quiet > "$TMP/ar" 2>&1 || { cat "$TMP/ar"; fail "gpt_replica --all_reduce failed"; }
v0=$(sed -n 's/^\[worker0\] After 60 training step(s), validation loss = \([^ ]*\) .*/\1/p' "$TMP/ar")
v1=$(sed -n 's/^\[worker1\] After 60 training step(s), validation loss = \([^ ]*\) .*/\1/p' "$TMP/ar")
check_le "worker 0's validation loss" "$v0" 3.6
check_number "worker 1's validation loss" "$v1"
[ "$v0" = "$v1" ] || fail "all-reduce: the workers' variables differ (validation loss $v0 vs $v1)"
echo "all-reduce, 2 workers: validation loss $v0 on both"
# Weight tying with the token embedding in 2 parts, one on each of 2 ps tasks: the parts are
# placed apart, the model learns as the whole one does, and gpt_sample assembles the table from
# the parts in the checkpoint.
"$BIN/dg-launch" --ps 2 --workers 1 --timeout 300 -- "$BIN/gpt_replica" --wte_parts 2 --train_steps 60 \
    --log_every 20 --eval_windows 48 --quiet --print_placement --checkpoint_path "$TMP/parts.db" > "$TMP/parts" 2>&1 ||
    { cat "$TMP/parts"; fail "gpt_replica --wte_parts 2 failed"; }
grep "variable wte/" "$TMP/parts"
grep -q "variable wte/part_0 on /job:ps/replica:0/task:0/" "$TMP/parts" || fail "wte/part_0 is not on ps task 0"
grep -q "variable wte/part_1 on /job:ps/replica:0/task:1/" "$TMP/parts" || fail "wte/part_1 is not on ps task 1"
vp=$(sed -n 's/^\[worker0\] After 60 training step(s), validation loss = \([^ ]*\) .*/\1/p' "$TMP/parts")
check_le "the validation loss with the embedding in 2 parts" "$vp" 3.6
"$BIN/gpt_sample" --checkpoint "$TMP/parts.db" --prompt "The " --tokens 100 --seed 5 > "$TMP/sample_parts" \
    2> "$TMP/sample_parts.err" || { cat "$TMP/sample_parts.err"; fail "gpt_sample from the parts failed"; }
[ "$(wc -c < "$TMP/sample_parts")" -eq 105 ] || fail "gpt_sample from the parts wrote $(wc -c < "$TMP/sample_parts") bytes"
echo "embedding in 2 parts on 2 ps tasks: validation loss $vp"
echo "PASS gpt_training"
