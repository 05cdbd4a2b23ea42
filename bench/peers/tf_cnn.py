#!/usr/bin/env python3
"""TensorFlow peer of the cnn_replica example, single process on the CPU, tf.compat.v1 graph
mode with one Session: the small CNN on Fashion-MNIST (Debian's dataset-fashion-mnist files,
pixels/255 in [0,1]), NHWC:

  conv 5x5 1->16 SAME + bias, ReLU, maxpool 2x2/2   -> 14x14x16
  conv 5x5 16->32 SAME + bias, ReLU, maxpool 2x2/2  -> 7x7x32, flatten (NHWC order) 1568
  dense 1568->128 ReLU, dropout 0.25 (training only), dense 128->10 logits
  loss: mean sparse softmax cross-entropy over the batch
  AdamOptimizer (0.9, 0.999, eps 1e-8), lr exponential_decay(0.001, global_step, 500, 0.95,
  staircase=False), i.e. 0.001 * 0.95^(step/500)
  Glorot-uniform kernels, zero biases, graph seed --seed; batch 100, fed with feed_dict.

--step-bench times single training steps (one Session.run of the train op) on one fixed batch
(the first training images) after 20 warm-up steps and prints one JSON line:
  {"bench": "tf_cnn", "metric": "cnn_step", "batch": 100, "threads": 1, "value": <mean ms>,
   "median_ms": ..., "unit": "ms", "steps": N, "tf": "<version>", ...}
Otherwise it trains --steps on epoch-shuffled random batches and prints a JSON line with
"metric": "cnn_train", steps_per_s (training loop only, data loading excluded),
test_accuracy and test_cross_entropy on the 10,000 test images (dropout off).
intra_op_parallelism_threads and inter_op_parallelism_threads are both --threads.
Without TensorFlow (or without the data files) it prints {"bench": "tf_cnn", "skipped": ...}
and exits 0. Run it with a virtualenv holding tensorflow-cpu (2.21 here):

  /root/tfvenv/bin/python bench/peers/tf_cnn.py --step-bench --threads 1
  /root/tfvenv/bin/python bench/peers/tf_cnn.py --steps 3000 --threads 1
"""
import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fmnist_data  # noqa: E402  (nothing heavy at import)

WARMUP = 20
EVAL_CHUNK = 1000


def emit(**kv):
    print(json.dumps({"bench": "tf_cnn", **kv}), flush=True)


def build(tf, tf1):
    """Returns (x, y_, dropout_rate, logits, loss, correct_sum, ce_sum, train_op, lr)."""
    glorot = tf1.glorot_uniform_initializer()
    zeros = tf1.zeros_initializer()

    def var(name, shape, init):
        return tf1.get_variable(name, shape, tf.float32, initializer=init)

    x = tf1.placeholder(tf.float32, [None, 28, 28, 1], name="x")
    y_ = tf1.placeholder(tf.int64, [None], name="y_")
    rate = tf1.placeholder_with_default(tf.constant(0.0), [], name="dropout_rate")

    def conv_relu_pool(h, name, cin, cout):
        w = var(name + "_w", [5, 5, cin, cout], glorot)
        b = var(name + "_b", [cout], zeros)
        h = tf.nn.conv2d(h, w, strides=[1, 1, 1, 1], padding="SAME")
        h = tf.nn.relu(tf.nn.bias_add(h, b))
        return tf.nn.max_pool2d(h, ksize=2, strides=2, padding="VALID")

    h = conv_relu_pool(x, "conv1", 1, 16)       # 14x14x16
    h = conv_relu_pool(h, "conv2", 16, 32)      # 7x7x32
    h = tf.reshape(h, [-1, 7 * 7 * 32])         # NHWC flatten
    w3, b3 = var("fc1_w", [7 * 7 * 32, 128], glorot), var("fc1_b", [128], zeros)
    h = tf.nn.relu(tf.matmul(h, w3) + b3)
    h = tf.nn.dropout(h, rate=rate)
    w4, b4 = var("fc2_w", [128, 10], glorot), var("fc2_b", [10], zeros)
    logits = tf.matmul(h, w4) + b4

    ce = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y_, logits=logits)
    loss = tf.reduce_mean(ce)
    ce_sum = tf.reduce_sum(ce)
    correct_sum = tf.reduce_sum(tf.cast(tf.equal(tf.argmax(logits, 1), y_), tf.int64))
    global_step = tf1.train.get_or_create_global_step()
    lr = tf1.train.exponential_decay(0.001, global_step, 500, 0.95, staircase=False)
    opt = tf1.train.AdamOptimizer(lr, beta1=0.9, beta2=0.999, epsilon=1e-8)
    train_op = opt.minimize(loss, global_step=global_step)
    return x, y_, rate, loss, correct_sum, ce_sum, train_op, lr


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=1, help="intra- and inter-op threads")
    ap.add_argument("--batch-size", type=int, default=100)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--steps", type=int, default=3000, help="training steps")
    ap.add_argument("--step-bench", action="store_true",
                    help="time steps on one fixed batch instead of training")
    ap.add_argument("--bench-steps", type=int, default=200,
                    help="timed steps of --step-bench (after %d warm-up steps)" % WARMUP)
    args = ap.parse_args()
    if not 1 <= args.threads <= 1024:
        ap.error("--threads must be in 1..1024")
    if not 1 <= args.batch_size <= 60000:
        ap.error("--batch-size must be in 1..60000")
    if not 0 <= args.seed < 2 ** 31:
        ap.error("--seed must be in 0..2^31-1")
    if not 1 <= args.steps <= 10_000_000:
        ap.error("--steps must be in 1..10000000")
    if not 1 <= args.bench_steps <= 1_000_000:
        ap.error("--bench-steps must be in 1..1000000")

    fmnist_data.set_thread_env(args.threads)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")  # hide INFO, keep warnings
    try:
        import numpy as np  # noqa: F401
        import tensorflow as tf
    except ImportError as e:
        emit(skipped="no TensorFlow/numpy: %s" % e)
        return 0
    missing = fmnist_data.missing_files()
    if missing:
        emit(skipped="Fashion-MNIST files missing in %s: %s" % (fmnist_data.DATA_DIR, missing))
        return 0
    tf1 = tf.compat.v1

    t0 = time.perf_counter()
    xtr, ytr, xte, yte = fmnist_data.load()
    load_s = time.perf_counter() - t0

    tf1.disable_eager_execution()
    tf1.set_random_seed(args.seed)
    x, y_, rate, loss, correct_sum, ce_sum, train_op, lr = build(tf, tf1)
    lead = dict(batch=args.batch_size, threads=args.threads)

    config = tf1.ConfigProto(intra_op_parallelism_threads=args.threads,
                             inter_op_parallelism_threads=args.threads)
    with tf1.Session(config=config) as sess:
        sess.run(tf1.global_variables_initializer())

        if args.step_bench:
            feed = {x: xtr[:args.batch_size], y_: ytr[:args.batch_size], rate: 0.25}
            times = []
            for i in range(WARMUP + args.bench_steps):
                s = time.perf_counter()
                sess.run(train_op, feed_dict=feed)
                if i >= WARMUP:
                    times.append((time.perf_counter() - s) * 1e3)
            mean, med, p10, p90 = fmnist_data.stats(times)
            emit(metric="cnn_step", **lead, value=round(mean, 4), median_ms=round(med, 4),
                 p10_ms=round(p10, 4), p90_ms=round(p90, 4), unit="ms", steps=len(times),
                 warmup=WARMUP, tf=tf.__version__)
            return 0

        sampler = fmnist_data.BatchSampler(len(xtr), args.batch_size, args.seed)
        tail = []
        t_start = time.perf_counter()
        for i in range(args.steps):
            idx = sampler.next()
            feed = {x: xtr[idx], y_: ytr[idx], rate: 0.25}
            if i >= args.steps - 100:
                tail.append(sess.run([train_op, loss], feed_dict=feed)[1])
            else:
                sess.run(train_op, feed_dict=feed)
        train_s = time.perf_counter() - t_start

        correct, ce_total = 0, 0.0
        for lo in range(0, len(xte), EVAL_CHUNK):
            c, s = sess.run([correct_sum, ce_sum], feed_dict={x: xte[lo:lo + EVAL_CHUNK],
                                                              y_: yte[lo:lo + EVAL_CHUNK]})
            correct += int(c)
            ce_total += float(s)
        final_lr = float(sess.run(lr))
    n_test = len(xte)
    sps = args.steps / train_s
    emit(metric="cnn_train", **lead, steps=args.steps, train_s=round(train_s, 3),
         steps_per_s=round(sps, 2), ms_per_step=round(1e3 / sps, 4),
         examples_per_s=round(sps * args.batch_size, 1),
         train_loss_last100=round(float(sum(tail)) / len(tail), 4),
         test_accuracy=round(correct / n_test, 4), test_cross_entropy=round(ce_total / n_test, 4),
         final_lr=final_lr, data_load_s=round(load_s, 2), seed=args.seed, tf=tf.__version__)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
