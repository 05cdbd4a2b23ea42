#!/usr/bin/env bash
# Input pipelines over the same TFRecord files: Fashion-MNIST's 60000 training examples (Debian's
# dataset-fashion-mnist, or $FMNIST_DIR) written by dg-tfrecord into $SHARDS shards, then read
# $EPOCHS times (default 5) through TFRecord -> parse (a float32 image [784] scaled by 1/255 and
# an int64 label) on 2 threads -> shuffle(10000) -> batch(100) -> prefetch by
#   distgraph   build/bin/dataset_bench (bench/dataset_bench.c)
#   tf.data     bench/peers/tf_dataset.py with TensorFlow from $TF_PYTHON (num_parallel_calls=2)
#   PyTorch     bench/peers/torch_dataset.py with Debian's python3-torch: a DataLoader of 2
#               worker processes over a Dataset reading the TFRecord framing (shuffled whole)
# Prints JSON lines: the CPU, each system's records per second, and distgraph's ratio to each
# peer (> 1: distgraph faster). A peer that is missing is reported skipped.
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/lib.bash
EPOCHS=${EPOCHS:-5}
SHARDS=${SHARDS:-4}
TF_PYTHON=${TF_PYTHON:-python3}
TORCH_PYTHON=${TORCH_PYTHON:-/usr/bin/python3}
FMNIST_DIR=${FMNIST_DIR:-/usr/share/datasets/fashion-mnist}
BIN=build/bin
for f in train-images-idx3-ubyte train-labels-idx1-ubyte; do
    [ -f "$FMNIST_DIR/$f.gz" ] || { echo "{\"bench\": \"dataset\", \"skipped\": \"no $FMNIST_DIR/$f.gz (apt-get install dataset-fashion-mnist)\"}"; exit 0; }
    gunzip -c "$FMNIST_DIR/$f.gz" >"$TMP/$f"
done
"$BIN/dg-tfrecord" idx --images "$TMP/train-images-idx3-ubyte" --labels "$TMP/train-labels-idx1-ubyte" \
    --out "$TMP/fmnist" --shards "$SHARDS" >"$TMP/shards" 2>/dev/null
mapfile -t files <"$TMP/shards"
cpu=$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -1)
echo "{\"bench\": \"dataset\", \"metric\": \"setup\", \"cpu\": \"$cpu\", \"cores\": $(nproc), \"kernels\": \"$("$BIN/dg-inspect" cpu)\", \"files\": ${#files[@]}, \"epochs\": $EPOCHS}"

rate() { python3 -c 'import json, sys; print(json.loads(sys.argv[1])["records_per_s"])' "$1"; }
ours_line=$("$BIN/dataset_bench" --epochs "$EPOCHS" --parallelism 2 --shuffle 10000 --batch 100 "${files[@]}")
echo "$ours_line"
ours=$(rate "$ours_line")
peer() {   # peer NAME COMMAND...
    local name=$1 line
    shift
    if ! line=$("$@" 2>"$TMP/$name.err" | tail -1) || [ -z "$line" ]; then
        echo "{\"bench\": \"dataset\", \"system\": \"$name\", \"skipped\": \"$(tail -1 "$TMP/$name.err" | tr -d '"\\')\"}"
        return
    fi
    echo "$line"
    awk -v o="$ours" -v p="$(rate "$line")" -v s="$name" 'BEGIN {
        printf "{\"bench\": \"dataset\", \"ratio\": \"distgraph/%s\", \"distgraph_speedup\": %.2f}\n", s, o / p }'
}
peer tf.data "$TF_PYTHON" bench/peers/tf_dataset.py --epochs "$EPOCHS" --parallelism 2 --shuffle 10000 --batch 100 "${files[@]}"
peer torch "$TORCH_PYTHON" bench/peers/torch_dataset.py --epochs "$EPOCHS" --workers 2 --batch 100 "${files[@]}"
