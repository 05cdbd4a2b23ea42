#!/usr/bin/env bash
# dg-ckpt-writer saves steps 1..5 of 8 variables (every dtype, a scalar, an empty tensor, a 4
# MiB float32) keeping the newest 3; dg-inspect lists those checkpoints and their variables
# (table and JSON; shapes, dtypes, bytes and the global_step value checked against what the
# writer stores). The test inserts TEST DATA into the summaries table with Python's sqlite3,
# as a file written by an earlier release holds it (the table's columns are those
# runtime/training/checkpoint.c creates; value NOT NULL here): dg-inspect summarizes it and
# plots it as well-formed SVG (one polyline point per step, the last row of a rewritten step,
# NaN/inf skipped and noted) and as an 800x480 PNG (drawn by cairo: decoded here with every
# row filter, then the lines' colours inside the plot area, the title's text and the note
# checked). Bad input exits 1 naming the file and what is missing; bad usage exits 2.
set -euo pipefail
bin="${DG_BIN_DIR:?}"
inspect="$bin/dg-inspect"
[ -x "$inspect" ] && [ -x "$bin/dg-ckpt-writer" ] || { echo "no dg-inspect / dg-ckpt-writer in $bin"; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
ckpt="$tmp/ckpt.db"

"$bin/dg-ckpt-writer" "$ckpt" --steps 5 --max_to_keep 3 > /dev/null || fail "dg-ckpt-writer failed"

# checkpoints: steps 3, 4, 5 kept, 8 variables of 4206368 bytes each, 5 the newest.
out=$("$inspect" checkpoints "$ckpt") || fail "dg-inspect checkpoints"
echo "$out"
for s in 3 4; do
    grep -Eq "^$s +[0-9]{4}-[0-9]{2}-[0-9]{2} [0-9:]{8} +8 +4206368 \\(4\\.0 MiB\\)\$" <<<"$out" || fail "row of step $s"
done
grep -Eq '^5 +.* +8 +4206368 \(4\.0 MiB\) +<- newest$' <<<"$out" || fail "step 5 is not marked newest"
grep -Eq '^[12] ' <<<"$out" && fail "pruned steps are listed"
grep -Fq "3 checkpoints in $ckpt, newest: step 5" <<<"$out" || fail "checkpoints summary line"
"$inspect" checkpoints "$ckpt" --json > "$tmp/ckpts.json" || fail "checkpoints --json"
python3 - "$tmp/ckpts.json" <<'EOF' || fail "checkpoints --json"
import json, sys, time
d = json.load(open(sys.argv[1]))
assert d["newest_step"] == 5, d
c = d["checkpoints"]
assert [x["step"] for x in c] == [3, 4, 5], c
assert all(x["n_variables"] == 8 and x["n_bytes"] == 4206368 for x in c), c
assert [x["newest"] for x in c] == [False, False, True], c
assert all(abs(x["created_unix_ms"] / 1000 - time.time()) < 3600 for x in c), c
EOF

# variables: the writer's 8 variables, of the newest step or of --step.
out=$("$inspect" variables "$ckpt" --values 3) || fail "dg-inspect variables"
echo "$out"
grep -Fq "checkpoint of step 5 (newest) in $ckpt" <<<"$out" || fail "variables header"
grep -Eq '^dense/kernel +float32 +\[1024,1024\] +5 +4194304 +.*\.\.\. \(1048573 more\)$' <<<"$out" || fail "dense/kernel row"
grep -Eq '^global_step +int64 +\[\] +5 +8 +5$' <<<"$out" || fail "global_step row (value 5)"
grep -Eq '^counts +int64 +\[0\] +5 +0 +\(empty\)$' <<<"$out" || fail "counts row"
grep -Fq "8 variables, 4206368 bytes (4.0 MiB)" <<<"$out" || fail "variables total"
for step in 3 5; do
    "$inspect" variables "$ckpt" --step $step --values 2 --json > "$tmp/vars$step.json" || fail "variables --step $step --json"
    python3 - "$tmp/vars$step.json" $step <<'EOF' || fail "variables --json, step $step"
import json, sys
d, step = json.load(open(sys.argv[1])), int(sys.argv[2])
assert d["step"] == step and d["newest"] == (step == 5) and d["n_bytes"] == 4206368, d
want = {  # tools/dg-ckpt-writer.c
    "global_step": ("int64", []), "dense/kernel": ("float32", [1024, 1024]),
    "dense/bias": ("float64", [1000]), "embed/ids": ("int32", [7, 11, 13]), "mask": ("bool", [33]),
    "pixels": ("uint8", [3, 5]), "counts": ("int64", [0]), "lr": ("float32", []),
}
got = {v["name"]: (v["dtype"], v["shape"]) for v in d["variables"]}
assert got == want, got
v = {x["name"]: x for x in d["variables"]}
assert all(x["step"] == step for x in d["variables"])
assert v["dense/kernel"]["n_bytes"] == 4 << 20 and v["mask"]["n_bytes"] == 33
assert v["global_step"]["values"] == [step], v["global_step"]
assert v["counts"]["values"] == [] and len(v["dense/bias"]["values"]) == 2
assert all(b in (True, False) for b in v["mask"]["values"])
EOF
done

# Summaries: TEST DATA inserted here, in the summaries table's columns (runtime/training/checkpoint.c).
# loss: steps 1..40, then inf at step 41, then steps 38..40 again with 3.0 (as after a
# restart from an older checkpoint: the later rows win). accuracy: every 5th step. single:
# one point. bad: -inf only.
python3 - "$ckpt" <<'EOF' || fail "inserting test summaries"
import math, sqlite3, sys
db = sqlite3.connect(sys.argv[1])
db.execute("CREATE TABLE IF NOT EXISTS summaries(step INTEGER NOT NULL, tag TEXT NOT NULL, "
           "value REAL NOT NULL, wall_time REAL NOT NULL)")
rows = [(s, "loss", 2 * math.exp(-s / 10), 1e9 + s) for s in range(1, 41)]
rows += [(41, "loss", float("inf"), 1e9 + 41)]
rows += [(s, "loss", 3.0, 1e9 + 100 + s) for s in (38, 39, 40)]
rows += [(s, "accuracy", 1 - math.exp(-s / 15), 1e9 + s) for s in range(5, 41, 5)]
rows += [(7, "single", 0.5, 1e9), (3, "bad", float("-inf"), 1e9)]
db.executemany("INSERT INTO summaries VALUES (?, ?, ?, ?)", rows)
db.commit()
db.close()
EOF
out=$("$inspect" summaries "$ckpt") || fail "dg-inspect summaries"
echo "$out"
grep -Eq '^accuracy +8 +5\.\.40 +0\.9305[0-9]* +0$' <<<"$out" || fail "accuracy row"
grep -Eq '^loss +44 \(41 steps\) +1\.\.41 +inf +1$' <<<"$out" || fail "loss row"
grep -Eq '^single +1 +7\.\.7 +0\.5 +0$' <<<"$out" || fail "single row"
grep -Fq "4 tags in $ckpt" <<<"$out" || fail "summaries total"
"$inspect" summaries "$ckpt" --json > "$tmp/sum.json" || fail "summaries --json"
python3 - "$tmp/sum.json" <<'EOF' || fail "summaries --json"
import json, sys
t = {x["tag"]: x for x in json.load(open(sys.argv[1]))["tags"]}
assert sorted(t) == ["accuracy", "bad", "loss", "single"], t
assert t["loss"]["count"] == 44 and t["loss"]["n_steps"] == 41 and t["loss"]["n_nonfinite"] == 1, t["loss"]
assert (t["loss"]["first_step"], t["loss"]["last_step"], t["loss"]["last_value"]) == (1, 41, None), t["loss"]
assert t["accuracy"]["count"] == 8 and t["accuracy"]["last_step"] == 40, t["accuracy"]
assert t["bad"]["n_nonfinite"] == 1 and t["bad"]["last_value"] is None, t["bad"]
EOF

# plot, SVG: one polyline per tag with one point per finite step, a legend, the note.
out=$("$inspect" plot "$ckpt" --tag loss --tag accuracy -o "$tmp/plot.svg") || fail "dg-inspect plot (svg)"
echo "$out"
grep -Fq "2 tags, 48 points, steps 1..40, 800x480 px; 1 non-finite value skipped (loss: 1)" <<<"$out" || fail "plot summary"
python3 - "$tmp/plot.svg" <<'EOF' || fail "plot SVG"
import sys, xml.etree.ElementTree as ET
ns = "{http://www.w3.org/2000/svg}"
root = ET.parse(sys.argv[1]).getroot()
assert root.tag == ns + "svg" and root.get("width") == "800" and root.get("height") == "480"
lines = {p.get("data-tag"): [tuple(map(float, xy.split(","))) for xy in p.get("points").split()]
         for p in root.iter(ns + "polyline")}
assert sorted(lines) == ["accuracy", "loss"], lines.keys()
loss, acc = lines["loss"], lines["accuracy"]
assert len(loss) == 40 and len(acc) == 8, (len(loss), len(acc))
assert all(a[0] < b[0] for a, b in zip(loss, loss[1:])), "loss points not by increasing step"
# The rewritten steps 38..40 (3.0) are the highest values: the smallest y in pixels.
assert min(range(40), key=lambda i: loss[i][1]) >= 37, loss[-5:]
texts = ["".join(t.itertext()) for t in root.iter(ns + "text")]
assert "step" in texts and "value" in texts, texts
assert "loss, accuracy (ckpt.db)" in texts, texts
assert "1 non-finite value skipped (loss: 1)" in texts, texts
assert "0" in texts and "40" in texts, texts          # x ticks
assert any(g.get("class") == "legend" for g in root.iter(ns + "g")), "no legend"
assert sum(1 for _ in root.iter(ns + "circle")) == 48, "one marker per point"
EOF
# One point: a marker, and axes around it.
"$inspect" plot "$ckpt" --tag single -o "$tmp/single.svg" > /dev/null || fail "plot one point"
python3 - "$tmp/single.svg" <<'EOF' || fail "one-point SVG"
import sys, xml.etree.ElementTree as ET
ns = "{http://www.w3.org/2000/svg}"
root = ET.parse(sys.argv[1]).getroot()
(p,) = root.iter(ns + "polyline")
assert len(p.get("points").split()) == 1
(c,) = root.iter(ns + "circle")
x, y = float(c.get("cx")), float(c.get("cy"))
assert 100 < x < 780 and 44 < y < 414, (x, y)
texts = ["".join(t.itertext()) for t in root.iter(ns + "text")]
assert "7" in texts and "single" in texts, texts
assert not any(g.get("class") == "legend" for g in root.iter(ns + "g")), "legend for one tag"
EOF

# plot, PNG (drawn by cairo): signature, chunk CRCs, IHDR; the rows inflated and unfiltered
# (cairo's libpng picks a filter per row); then what is drawn where: the background, each
# series' colour inside the plot area (84..776 x 44..414), dark text in the title band and
# the red note under the chart only when values were skipped.
out=$("$inspect" plot "$ckpt" --tag loss --tag accuracy -o "$tmp/plot.png") || fail "dg-inspect plot (png)"
echo "$out"
grep -Fq "2 tags, 48 points, steps 1..40, 800x480 px; 1 non-finite value skipped (loss: 1)" <<<"$out" || fail "plot (png) summary"
"$inspect" plot "$ckpt" --tag single -o "$tmp/SINGLE.PNG" > /dev/null || fail "plot to .PNG"
for png in "$tmp/plot.png" "$tmp/SINGLE.PNG"; do
python3 - "$png" <<'EOF' || fail "PNG $png"
import struct, sys, zlib
data = open(sys.argv[1], "rb").read()
assert data[:8] == b"\x89PNG\r\n\x1a\n", "signature"
pos, chunks = 8, []
while pos < len(data):
    n, = struct.unpack(">I", data[pos:pos + 4])
    kind, body = data[pos + 4:pos + 8], data[pos + 8:pos + 8 + n]
    crc, = struct.unpack(">I", data[pos + 8 + n:pos + 12 + n])
    assert zlib.crc32(kind + body) == crc, "CRC of %r" % kind
    chunks.append((kind, body))
    pos += 12 + n
kinds = [k for k, _ in chunks]
assert kinds[0] == b"IHDR" and kinds[-1] == b"IEND" and b"IDAT" in kinds, kinds
w, h, depth, ctype, comp, filt, lace = struct.unpack(">IIBBBBB", chunks[0][1])
assert (w, h, depth, comp, filt, lace) == (800, 480, 8, 0, 0, 0) and ctype in (2, 6), (w, h, depth, ctype, lace)
bpp = 3 if ctype == 2 else 4
raw = zlib.decompress(b"".join(b for k, b in chunks if k == b"IDAT"))
stride = 1 + bpp * w
assert len(raw) == h * stride, (len(raw), h * stride)
rows, prev = [], bytearray(stride - 1)
for y in range(h):
    f, line = raw[y * stride], bytearray(raw[y * stride + 1:(y + 1) * stride])
    assert f <= 4, "filter type %d in row %d" % (f, y)
    for i in range(len(line)):
        a = line[i - bpp] if i >= bpp else 0
        b, c = prev[i], prev[i - bpp] if i >= bpp else 0
        if f == 1: line[i] = (line[i] + a) & 255
        elif f == 2: line[i] = (line[i] + b) & 255
        elif f == 3: line[i] = (line[i] + (a + b) // 2) & 255
        elif f == 4:
            p = a + b - c
            pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
            line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
    rows.append(line)
    prev = line
def px(x, y):
    return tuple(rows[y][bpp * x:bpp * x + 3])
def count(x0, x1, y0, y1, near, tol=60):
    return sum(1 for y in range(y0, y1) for x in range(x0, x1)
               if sum(abs(p - q) for p, q in zip(px(x, y), near)) <= tol)
white = count(0, w, 0, h, (255, 255, 255), 0)
blue = count(86, 775, 46, 413, (0x1f, 0x77, 0xb4))
orange = count(86, 775, 46, 413, (0xff, 0x7f, 0x0e))
title = sum(1 for y in range(4, 38) for x in range(200, 600) if max(px(x, y)) < 0x80)
note = count(84, 500, 450, 480, (0xaa, 0, 0), 90)
assert white > 0.7 * w * h, white
assert blue > 40, blue
assert title > 50, "no title text drawn: %d dark pixels" % title
if "plot" in sys.argv[1]:
    assert orange > 40 and note > 20, (orange, note)
else:
    assert orange == 0 and note == 0, (orange, note)
print(sys.argv[1].rsplit("/", 1)[1], "PNG", w, "x", h, "white", white, "blue", blue, "orange", orange,
      "title", title, "note", note)
EOF
done

# Inspecting changes nothing: every checkpoint still verifies, no -wal/-shm is left behind.
"$bin/dg-ckpt-writer" --verify "$ckpt" || fail "checkpoint changed by dg-inspect"
[ ! -e "$ckpt-wal" ] && [ ! -e "$ckpt-shm" ] || fail "WAL files left behind"

# expect_fail RC PATTERN ARGS...: exit RC and a message matching PATTERN on stderr.
expect_fail() {
    local want=$1 pattern=$2
    shift 2
    set +e
    err=$("$inspect" "$@" 2>&1 >/dev/null)
    rc=$?
    set -e
    head -1 <<<"$err"
    [ "$rc" -eq "$want" ] || fail "dg-inspect $* exited $rc, expected $want"
    grep -Eq -- "$pattern" <<<"$err" || fail "dg-inspect $*: message does not match $pattern"
}
"$bin/dg-ckpt-writer" "$tmp/empty.db" --steps 0 > /dev/null
"$bin/dg-ckpt-writer" "$tmp/nosum.db" --steps 1 > /dev/null
printf 'not a checkpoint\n' > "$tmp/text.db"
head -c 8192 /dev/urandom > "$tmp/garbage.db"
python3 -c 'import sqlite3,sys; d=sqlite3.connect(sys.argv[1]); d.execute("CREATE TABLE t(a)"); d.commit()' "$tmp/other.db"
expect_fail 1 "NOT_FOUND: checkpoint \"$tmp/missing.db\"" checkpoints "$tmp/missing.db"
expect_fail 1 "NOT_FOUND: checkpoint \"$tmp/missing.db\"" plot "$tmp/missing.db" --tag loss -o "$tmp/x.svg"
expect_fail 1 "DATA_LOSS: checkpoint \"$tmp/text.db\".*not an SQLite database" variables "$tmp/text.db"
expect_fail 1 "DATA_LOSS: checkpoint \"$tmp/garbage.db\"" summaries "$tmp/garbage.db"
expect_fail 1 "FAILED_PRECONDITION: checkpoint \"$tmp/other.db\": an SQLite database of another schema" checkpoints "$tmp/other.db"
expect_fail 1 "\"$tmp/empty.db\": holds no checkpoints" checkpoints "$tmp/empty.db"
expect_fail 1 "\"$tmp/empty.db\": holds no checkpoints" variables "$tmp/empty.db"
expect_fail 1 "\"$ckpt\" has no checkpoint of global step 2; it holds steps 3, 4, 5" variables "$ckpt" --step 2
expect_fail 1 "\"$tmp/nosum.db\": no summaries table" summaries "$tmp/nosum.db"
expect_fail 1 "\"$tmp/nosum.db\": no summaries table" plot "$tmp/nosum.db" --tag loss -o "$tmp/x.png"
cp "$tmp/nosum.db" "$tmp/emptysum.db"
python3 -c 'import sqlite3,sys; d=sqlite3.connect(sys.argv[1]); d.execute("CREATE TABLE summaries(step INTEGER NOT NULL, tag TEXT NOT NULL, value REAL NOT NULL, wall_time REAL NOT NULL)"); d.commit()' "$tmp/emptysum.db"
expect_fail 1 "\"$tmp/emptysum.db\": the summaries table is empty" summaries "$tmp/emptysum.db" --json
expect_fail 1 "\"$ckpt\": no summaries with tag \"nope\" \\(known tags: accuracy, bad, loss, single\\)" \
    plot "$ckpt" --tag loss --tag nope -o "$tmp/x.svg"
expect_fail 1 "\"$ckpt\": nothing to plot: every value of bad is non-finite" plot "$ckpt" --tag bad -o "$tmp/x.svg"
expect_fail 1 "cannot write $tmp/no/dir.svg" plot "$ckpt" --tag loss -o "$tmp/no/dir.svg"
[ ! -e "$tmp/x.svg" ] && [ ! -e "$tmp/x.png" ] || fail "a failed plot wrote a file"
expect_fail 2 "plot needs --tag TAG and -o" plot "$ckpt" -o "$tmp/x.svg"
expect_fail 2 "plot needs --tag TAG and -o" plot "$ckpt" --tag loss
expect_fail 2 "by the extension of -o: got \"$tmp/x.jpg\"" plot "$ckpt" --tag loss -o "$tmp/x.jpg"
expect_fail 2 "--step must be an integer" variables "$ckpt" --step -1
expect_fail 2 "--values must be an integer" variables "$ckpt" --values many
expect_fail 2 "--step applies to variables only" checkpoints "$ckpt" --step 3
expect_fail 2 "--tag applies to plot only" summaries "$ckpt" --tag loss
expect_fail 2 "checkpoints needs a checkpoint FILE" checkpoints
expect_fail 2 "unknown command \"checkpoint\"" checkpoint "$ckpt"

# Slices (parts of partitioned variables): TEST DATA in the columns of the slices table
# (runtime/training/checkpoint.c), marking pixels [3,5] of the newest step as rows [3, 6) of a
# variable image [6,5]. variables shows where each slice lies; other variables show nothing.
cp "$ckpt" "$tmp/sliced.db"
python3 - "$tmp/sliced.db" <<'EOF' || fail "inserting test slices"
import sqlite3, sys
db = sqlite3.connect(sys.argv[1])
db.execute("CREATE TABLE slices(tensor_id INTEGER PRIMARY KEY, full_name TEXT NOT NULL, "
           "full_dims TEXT NOT NULL, offsets TEXT NOT NULL)")
db.execute("INSERT INTO slices SELECT id, 'image', '[6,5]', '[3,0]' FROM tensors WHERE name = 'pixels' "
           "AND checkpoint_id = (SELECT max(id) FROM checkpoints)")
db.commit()
EOF
out=$("$inspect" variables "$tmp/sliced.db") || fail "variables of a file with slices"
echo "$out"
grep -Eq '^name +dtype +shape +step +bytes +slice of$' <<<"$out" || fail "slices header"
grep -Eq '^pixels +uint8 +\[3,5\] +5 +15 +image \[6,5\] at \[3,0\]$' <<<"$out" || fail "pixels slice row"
grep -Eq '^mask +bool +\[33\] +5 +33$' <<<"$out" || fail "mask row beside slices"
"$inspect" variables "$tmp/sliced.db" --json > "$tmp/sliced.json" || fail "variables --json with slices"
python3 - "$tmp/sliced.json" <<'EOF' || fail "variables --json with slices"
import json, sys
v = {x["name"]: x for x in json.load(open(sys.argv[1]))["variables"]}
assert v["pixels"]["slice"] == {"full_name": "image", "full_shape": [6, 5], "offset": [3, 0]}, v["pixels"]
assert all("slice" not in x for n, x in v.items() if n != "pixels"), v
EOF
# Variables of an older step of that file have no slices: no column.
out=$("$inspect" variables "$tmp/sliced.db" --step 4) || fail "variables --step 4 of a file with slices"
[[ "$out" != *"slice of"* ]] || fail "a slice column without slices"
echo "dg-inspect checkpoint smoke: ok"
