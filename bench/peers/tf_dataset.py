"""tf.data's side of bench/dataset_compare.sh: records per second of
TFRecordDataset -> map(parse, num_parallel_calls) -> shuffle -> batch -> prefetch over TFRecord
shards written by dg-tfrecord (each record: the label as 8 bytes little-endian, then 784 uint8
pixels), read EPOCHS times, each epoch a new pass of the dataset. The pipeline of
bench/dataset_bench.c. Prints one JSON line.

usage: tf_dataset.py [--epochs N] [--parallelism P] [--shuffle B] [--batch K] FILE...
"""
import argparse
import json
import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--parallelism", type=int, default=2)
    ap.add_argument("--shuffle", type=int, default=10000)
    ap.add_argument("--batch", type=int, default=100)
    ap.add_argument("files", nargs="+")
    a = ap.parse_args()
    import tensorflow as tf

    def parse(rec):
        b = tf.io.decode_raw(rec, tf.uint8)
        label = tf.io.decode_raw(tf.strings.substr(rec, 0, 8), tf.int64)[0]
        image = tf.cast(b[8:], tf.float32) * (1.0 / 255.0)
        return tf.reshape(image, [784]), label

    ds = (tf.data.TFRecordDataset(a.files)
          .map(parse, num_parallel_calls=a.parallelism)
          .shuffle(a.shuffle, seed=1)
          .batch(a.batch)
          .prefetch(tf.data.AUTOTUNE))
    records, total = 0, 0.0
    t0 = time.perf_counter()
    for _ in range(a.epochs):
        for image, label in ds:
            records += int(image.shape[0])
            total += float(image.numpy()[0, 0]) + float(label.numpy()[0])
    s = time.perf_counter() - t0
    print(json.dumps({"bench": "dataset", "system": "tf.data", "version": tf.__version__,
                      "records_per_s": round(records / s), "records": records, "epochs": a.epochs,
                      "seconds": round(s, 3), "parallelism": a.parallelism, "shuffle": a.shuffle,
                      "batch": a.batch, "checksum": round(total, 1)}))


if __name__ == "__main__":
    main()
