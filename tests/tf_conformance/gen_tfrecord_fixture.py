#!/usr/bin/env python3
"""Writes tests/tf_conformance/tf_written.tfrecord with TensorFlow's own writer, the file that
tests/runtime/test_dataset.c reads (and compares with its own writer's bytes).

    python3 tests/tf_conformance/gen_tfrecord_fixture.py   (TensorFlow 2.21, tensorflow-cpu)

The records, in order: the empty record, b"a", b"hello, TFRecord", bytes 0..99, and 300
bytes of (i * 7) % 256; test_dataset.c builds the same list.
"""
import os

import tensorflow as tf

RECORDS = [b"", b"a", b"hello, TFRecord", bytes(range(100)), bytes((i * 7) % 256 for i in range(300))]


def main():
    out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "tf_written.tfrecord")
    with tf.io.TFRecordWriter(out) as w:
        for r in RECORDS:
            w.write(r)
    # TensorFlow reads back what it wrote (a check of the script, not of distgraph).
    got = [bytes(x.numpy()) for x in tf.data.TFRecordDataset(out)]
    assert got == RECORDS, "TensorFlow did not read back its own records"
    print(f"{out}: {len(RECORDS)} records, {os.path.getsize(out)} bytes, TensorFlow {tf.__version__}")


if __name__ == "__main__":
    main()
