#!/usr/bin/env bash
# dg-mlp-graph writes the MNIST-replica MLP under a replica device setter (2 ps tasks, 1
# worker); dg-inspect lists it (table and JSON), places it (variables round robin over the ps
# tasks in creation order: hid_w, sm_w, global_step on ps 0; hid_b, sm_b on ps 1), partitions
# it (Send/Recv pairs between the ps tasks and the worker) and draws it as well-formed SVG.
# --mixed_precision shows the rewritten graph.
# place --auto honours the requests and colocation, keeps devices under --memory_cap, and prints
# its prediction; an unscoped graph is spread. Bad input (truncated file, garbage, missing file,
# bad cluster spec, unplaceable graph, unknown shapes, caps nothing fits, a bad cost file) exits
# 1 with a message naming the problem, never a crash.
set -euo pipefail
bin="${DG_BIN_DIR:?}"
inspect="$bin/dg-inspect"
[ -x "$inspect" ] && [ -x "$bin/dg-mlp-graph" ] || { echo "no dg-inspect / dg-mlp-graph in $bin"; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
spec='ps|127.0.0.1:2222,127.0.0.1:2223;worker|127.0.0.1:2224'
ps0=/job:ps/replica:0/task:0/device:CPU:0
ps1=/job:ps/replica:0/task:1/device:CPU:0
worker=/job:worker/replica:0/task:0/device:CPU:0

"$bin/dg-mlp-graph" "$tmp/mlp.graph" || fail "dg-mlp-graph failed"
[ -s "$tmp/mlp.graph" ] || fail "no graph file"

# graph: the table and JSON.
out=$("$inspect" graph "$tmp/mlp.graph") || fail "dg-inspect graph"
head -5 <<<"$out"   # not echo | head: under pipefail, head leaving early fails echo (EPIPE)
grep -Eq '^2 +hid_w +VariableV2 +float32\[784,100\] +/job:ps/task:0 ' <<<"$out" || fail "hid_w row"
grep -Eq '^[0-9]+ +MatMul +MatMul +float32\[\?,100\] +/job:worker/task:0 .* x, hid_w$' <<<"$out" \
    || fail "MatMul row"
grep -Eq '^[0-9]+ nodes$' <<<"$out" || fail "node count line"
"$inspect" graph "$tmp/mlp.graph" --json > "$tmp/graph.json" || fail "dg-inspect graph --json"
python3 - "$tmp/graph.json" <<'EOF' || fail "graph --json"
import json, sys
nodes = {n["name"]: n for n in json.load(open(sys.argv[1]))}
assert nodes["hid_w"]["op"] == "VariableV2", nodes["hid_w"]
assert nodes["hid_w"]["outputs"] == [{"dtype": "float32", "shape": [784, 100]}]
assert nodes["x"]["outputs"][0]["shape"] == [-1, 784]
assert nodes["hid_b"]["requested_device"] == "/job:ps/task:1"
assert nodes["hid_w/Adam"]["colocation"] == ["hid_w"]
assert nodes["init"]["control_inputs"], "init has control inputs"
EOF

# place: round robin over the ps tasks; the rest on the worker.
out=$("$inspect" place "$tmp/mlp.graph" --cluster_spec "$spec") || fail "dg-inspect place"
check_place() {
    grep -Eq "^$1 +[A-Za-z0-9]+ +-> +$2\$" <<<"$out" || fail "$1 should be on $2"
}
check_place hid_w "$ps0"
check_place hid_b "$ps1"
check_place sm_w "$ps0"
check_place sm_b "$ps1"
check_place global_step "$ps0"
check_place "hid_w/Adam" "$ps0"
check_place "hid_b/Adam_1" "$ps1"
check_place "Adam/update_hid_b/ApplyAdam" "$ps1"
check_place MatMul "$worker"
check_place "cross_entropy/xentropy" "$worker"
grep -Eq "nodes placed on 3 devices" <<<"$out" || fail "placement summary"
"$inspect" place "$tmp/mlp.graph" --cluster_spec "$spec" --json > "$tmp/place.json"
python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); assert d["sm_b"].endswith("task:1/device:CPU:0"), d' \
    "$tmp/place.json" || fail "place --json"
# With GPUs, compute ops prefer GPU:0 of their task.
rc=0
out=$("$inspect" place "$tmp/mlp.graph" --cluster_spec "$spec" --gpus_per_task 2 2>&1) || rc=$?
[ "$rc" = 0 ] || { echo "$out" | tail -5; fail "dg-inspect place --gpus_per_task 2 exited $rc"; }
grep -E "^MatMul " <<<"$out" || { echo "$out" | tail -5; fail "no MatMul row with --gpus_per_task 2"; }
check_place MatMul /job:worker/replica:0/task:0/device:GPU:0

# partition: one list per device and the Send/Recv pairs.
out=$("$inspect" partition "$tmp/mlp.graph" --cluster_spec "$spec") || fail "dg-inspect partition"
grep -E '^/job:' <<<"$out" || true
for d in "$ps0" "$ps1" "$worker"; do
    grep -Eq "^$d \\([0-9]+ nodes\\)\$" <<<"$out" || fail "no partition for $d"
done
grep -Eq "^Send/Recv pairs \\([1-9][0-9]*\\):\$" <<<"$out" || fail "no Send/Recv pairs"
grep -Fq "  hid_w:0: $ps0 -> $worker" <<<"$out" || fail "hid_w is not sent to the worker"
grep -Fq "  hid_b:0: $ps1 -> $worker" <<<"$out" || fail "hid_b is not sent to the worker"
grep -Fq "  gradients/MatMul_grad/MatMul_1:0: $worker -> $ps0" <<<"$out" || fail "hid_w's gradient is not sent to ps 0"
"$inspect" partition "$tmp/mlp.graph" --cluster_spec "$spec" --json > "$tmp/part.json"
python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); assert len(d["devices"]) == 3 and d["transfers"], d' \
    "$tmp/part.json" || fail "partition --json"

# svg: well-formed, one box per device, Send/Recv edges with labels.
"$inspect" svg "$tmp/mlp.graph" --cluster_spec "$spec" -o "$tmp/mlp.svg" || fail "dg-inspect svg"
python3 -c 'import xml.dom.minidom,sys; xml.dom.minidom.parse(sys.argv[1])' "$tmp/mlp.svg" || fail "svg is not XML"
for d in "$ps0" "$ps1" "$worker"; do grep -Fq ">$d</text>" "$tmp/mlp.svg" || fail "svg has no box for $d"; done
grep -q 'marker-end="url(#arrow-xfer)"' "$tmp/mlp.svg" || fail "svg has no Send/Recv edge"
grep -Fq '>hid_w:0</text>' "$tmp/mlp.svg" || fail "svg has no hid_w:0 label"
if grep -Fq '>hid_w/Initializer/' "$tmp/mlp.svg"; then fail "initializers are not hidden"; fi
"$inspect" svg "$tmp/mlp.graph" --cluster_spec "$spec" -o "$tmp/all.svg" --show_init > /dev/null
grep -Fq 'hid_w/Assign' "$tmp/all.svg" || fail "--show_init does not show initializers"

# expect_fail PATTERN ARGS...: exit 1 and a message matching PATTERN on stderr.
expect_fail() {
    local pattern=$1
    shift
    set +e
    err=$("$inspect" "$@" 2>&1 >/dev/null)
    rc=$?
    set -e
    echo "$err"
    [ "$rc" -eq 1 ] || fail "dg-inspect $* exited $rc, expected 1"
    grep -Eq "$pattern" <<<"$err" || fail "dg-inspect $*: message does not match $pattern"
}
head -c 1000 "$tmp/mlp.graph" > "$tmp/truncated.graph"
expect_fail "DATA_LOSS: graph file \"$tmp/truncated.graph\": truncated" graph "$tmp/truncated.graph"
expect_fail "DATA_LOSS: .*truncated.graph" svg "$tmp/truncated.graph" --cluster_spec "$spec" -o "$tmp/x.svg"
head -c 4096 /dev/urandom > "$tmp/garbage.graph"
expect_fail "DATA_LOSS: graph file \"$tmp/garbage.graph\"" graph "$tmp/garbage.graph"
printf 'not a graph\n' > "$tmp/text.graph"
expect_fail "DATA_LOSS: graph file \"$tmp/text.graph\": not a distgraph graph" place "$tmp/text.graph" --cluster_spec "$spec"
expect_fail "NOT_FOUND: graph file \"$tmp/missing.graph\"" graph "$tmp/missing.graph"
expect_fail "INVALID_ARGUMENT" place "$tmp/mlp.graph" --cluster_spec 'ps|'
# A cluster without the ps tasks the graph asks for cannot place it.
expect_fail "placing: INVALID_ARGUMENT" place "$tmp/mlp.graph" --cluster_spec 'worker|127.0.0.1:2224' --no_soft_placement
# --mixed_precision bf16: the rewritten graph, its products and the ops between them in
# bfloat16, the variables cast on their own ps task, the loss reading the logits back.
out=$("$inspect" graph "$tmp/mlp.graph" --mixed_precision bf16 2> "$tmp/mp.err") || fail "graph --mixed_precision bf16"
grep -q 'mixed precision: 10 nodes compute in bfloat16, 16 casts added' "$tmp/mp.err" || fail "no rewrite summary"
grep -Eq '^[0-9]+ +hid_w/CastToBfloat16 +Cast +bfloat16\[784,100\] +/job:ps/task:0 ' <<<"$out" || fail "hid_w's cast row"
grep -Eq '^[0-9]+ +MatMul +MatMul +bfloat16\[\?,100\] .* x/CastToBfloat16, hid_w/CastToBfloat16$' <<<"$out" \
    || fail "bfloat16 MatMul row"
grep -Eq '^[0-9]+ +cross_entropy/xentropy +SparseSoftmaxCrossEntropyWithLogits +float32.* logits/CastToFloat32, y_$' \
    <<<"$out" || fail "the loss does not read the logits back in float32"
set +e
"$inspect" graph "$tmp/mlp.graph" --mixed_precision int8 > /dev/null 2> "$tmp/mp.err"
rc=$?
set -e
[ "$rc" -eq 2 ] && grep -q '"int8" is not bf16 or fp16' "$tmp/mp.err" || fail "--mixed_precision int8: exit $rc"
# place --auto: the scoped graph keeps its requests; an unscoped one (dg-mlp-graph
# --no_devices) is spread by the cost model, variables with their Adam slots and updates, each
# device under --memory_cap; the prediction and each device's load and bytes are printed.
out=$("$inspect" place "$tmp/mlp.graph" --cluster_spec "$spec" --auto --unknown_dim 100) || fail "place --auto"
check_place hid_w "$ps0"
check_place sm_b "$ps1"
grep -Eq '^automatic placement \((auto|m-topo|m-etf|m-sct|metis), [0-9.]+ s\): predicted step [0-9.]+ ms' <<<"$out" \
    || fail "no prediction line"
"$bin/dg-mlp-graph" "$tmp/free.graph" --no_devices > /dev/null || fail "dg-mlp-graph --no_devices"
spec2='worker|127.0.0.1:2224;127.0.0.1:2225'
# The cap: 80% of the bytes the graph holds on one device (hid_w with its Adam slots and
# gradient is more than half of them).
"$inspect" place "$tmp/free.graph" --cluster_spec "$spec2" --auto --unknown_dim 100 --json > "$tmp/one.json" \
    || fail "place --auto --json"
cap=$(python3 -c 'import json,sys; print(int(0.8 * sum(d["static_bytes"] for d in json.load(open(sys.argv[1]))["auto"]["devices"])))' "$tmp/one.json")
"$inspect" place "$tmp/free.graph" --cluster_spec "$spec2" --auto --unknown_dim 100 --memory_cap "$cap" --json \
    > "$tmp/auto.json" || fail "place --auto --memory_cap $cap --json"
python3 - "$tmp/auto.json" "$cap" <<'EOF' || fail "place --auto --json"
import json, sys
d, cap = json.load(open(sys.argv[1])), int(sys.argv[2])
p, a = d["placement"], d["auto"]
assert p["hid_w/Adam"] == p["hid_w"] and p["Adam/update_hid_w/ApplyAdam"] == p["hid_w"], p
assert a["predicted_step_ms"] > 0 and len(a["devices"]) == 2, a
for dev in a["devices"]:
    assert 0 < dev["static_bytes"] <= cap and dev["peak_bytes"] <= dev["static_bytes"], dev
    assert 0 <= dev["load"] <= 1, dev
assert len(set(p.values())) == 2, "both devices used under the cap"
EOF
"$inspect" svg "$tmp/free.graph" --cluster_spec "$spec2" --auto --unknown_dim 100 -o "$tmp/auto.svg" > /dev/null \
    || fail "svg --auto"
python3 -c 'import xml.dom.minidom,sys; xml.dom.minidom.parse(sys.argv[1])' "$tmp/auto.svg" || fail "svg --auto is not XML"
expect_fail 'node "x" \(Placeholder\) output 0 has shape \[\?, 784\]' place "$tmp/free.graph" --cluster_spec "$spec2" --auto
expect_fail 'RESOURCE_EXHAUSTED: .*under the memory caps' place "$tmp/free.graph" --cluster_spec "$spec2" --auto \
    --unknown_dim 100 --memory_cap 1000
printf '{"devices": {"CPU": {"flops_per_s": 0}}}' > "$tmp/cost.json"
expect_fail "cost.json: devices.CPU.bytes_per_s must be a number" place "$tmp/free.graph" --cluster_spec "$spec2" \
    --auto --unknown_dim 100 --cost "$tmp/cost.json"

set +e
"$inspect" bogus "$tmp/mlp.graph" > /dev/null 2>&1
rc=$?
set -e
[ "$rc" -eq 2 ] || fail "an unknown command exits $rc, expected 2"
echo "dg-inspect smoke: ok"
