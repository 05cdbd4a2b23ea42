#!/usr/bin/env bash
# dg-tfrecord: --help names the record layout; an IDX pair of 5 examples (3x2 uint8 images,
# uint8 labels) becomes 2 shards holding examples 0, 2, 4 and 1, 3, each record the label as 8
# bytes little-endian and then the 6 pixels; text lines become records; `count` reads them
# back and fails, naming the file and the offset, on a damaged record; a failed run leaves no
# shard behind, and --shards is bounded. Bytes are checked with od, not with the tool's own
# reading.
set -euo pipefail
tool="${DG_BIN_DIR:?}/dg-tfrecord"
[ -x "$tool" ] || { echo "FAIL: no $tool"; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

"$tool" --help | grep -q "the label:  8 bytes, a signed integer, little-endian" || fail "--help does not give the layout"
if "$tool" idx --images "$tmp/none" --labels "$tmp/none" --out "$tmp/x" 2>"$tmp/err"; then fail "a missing file passed"; fi
grep -q "NOT_FOUND.*$tmp/none" "$tmp/err" || fail "missing file not named: $(cat "$tmp/err")"

# Images: magic 0 0 8 3, dims 5 3 2, pixels 10*i + k; labels: magic 0 0 8 1, dim 5, labels 7..3.
{ printf '\x00\x00\x08\x03\x00\x00\x00\x05\x00\x00\x00\x03\x00\x00\x00\x02'
  for i in 0 1 2 3 4; do for k in 0 1 2 3 4 5; do printf "\\x$(printf %02x $((10 * i + k)))"; done; done
} >"$tmp/img.idx"
{ printf '\x00\x00\x08\x01\x00\x00\x00\x05'; printf '\x07\x06\x05\x04\x03'; } >"$tmp/lab.idx"
"$tool" idx --images "$tmp/img.idx" --labels "$tmp/lab.idx" --out "$tmp/fm" --shards 2 >"$tmp/list"
[ "$(wc -l <"$tmp/list")" -eq 2 ] || fail "expected 2 shard names, got: $(cat "$tmp/list")"
s0="$tmp/fm-00000-of-00002.tfrecord"
s1="$tmp/fm-00001-of-00002.tfrecord"
# 3 and 2 records of 16 + 14 bytes.
[ "$(stat -c %s "$s0")" -eq 90 ] || fail "shard 0 is $(stat -c %s "$s0") bytes, not 90"
[ "$(stat -c %s "$s1")" -eq 60 ] || fail "shard 1 is $(stat -c %s "$s1") bytes, not 60"
# Shard 1's first record (example 1): length 14, then label 6 and pixels 10..15.
got=$(od -An -tu1 -j12 -N14 "$s1" | tr -s ' \n' ' ' | sed 's/^ //; s/ $//')
[ "$got" = "6 0 0 0 0 0 0 0 10 11 12 13 14 15" ] || fail "shard 1 record 0 holds: $got"
len=$(od -An -tu8 -N8 "$s1" | tr -d ' ')
[ "$len" = 14 ] || fail "length field $len"
"$tool" count "$s0" "$s1" >"$tmp/count"
grep -q "fm-00000-of-00002.tfrecord: 3 records, 42 bytes" "$tmp/count" || fail "count: $(cat "$tmp/count")"
grep -q "fm-00001-of-00002.tfrecord: 2 records, 28 bytes" "$tmp/count" || fail "count: $(cat "$tmp/count")"

printf 'first\r\nsecond\nthird' >"$tmp/t.txt"
"$tool" text --out "$tmp/tx" "$tmp/t.txt" >/dev/null
"$tool" count "$tmp/tx-00000-of-00001.tfrecord" | grep -q ": 3 records, 16 bytes" || fail "text records"

# A flipped data byte in shard 0's second record (at byte 30): the tool names file and offset.
cp "$s0" "$tmp/bad.tfrecord"
printf '\xff' | dd of="$tmp/bad.tfrecord" bs=1 seek=45 conv=notrunc status=none
if "$tool" count "$tmp/bad.tfrecord" 2>"$tmp/err"; then fail "a damaged record passed"; fi
grep -q "DATA_LOSS.*bad.tfrecord\": record at byte 30: corrupted data" "$tmp/err" || fail "damage: $(cat "$tmp/err")"
# Shards are complete or absent: no temporary file stays after a run, and a run that fails
# part way (its second input is missing) leaves neither shards nor temporary files.
[ -z "$(find "$tmp" -name '*.tmp-*')" ] || fail "temporary files left: $(find "$tmp" -name '*.tmp-*')"
if "$tool" text --out "$tmp/half" --shards 2 "$tmp/t.txt" "$tmp/none.txt" 2>"$tmp/err"; then fail "a missing input passed"; fi
grep -q "NOT_FOUND.*none.txt" "$tmp/err" || fail "missing input not named: $(cat "$tmp/err")"
[ -z "$(find "$tmp" -name 'half*')" ] || fail "a failed run left: $(find "$tmp" -name 'half*')"
# More shards than files a process should hold open: refused by name.
if "$tool" text --out "$tmp/many" --shards 5000 "$tmp/t.txt" 2>"$tmp/err"; then fail "--shards 5000 passed"; fi
grep -q -- "--shards takes 1 to 4096" "$tmp/err" || fail "--shards 5000: $(cat "$tmp/err")"
echo "dg-tfrecord: layout, shards, text records, damage, temporary names and the shard limit checked"
