#!/usr/bin/env python3
"""TensorFlow peer of gpt_replica (examples/gpt_replica.c), for speed: the same byte-level GPT
(bench/peers/torch_gpt.py describes it) built in tf.compat.v1 graph mode and trained in one
Session, on the same text and batch stream, with the same optimizer (AdamW as dg_adamw: the
decay var -= lr * wd * var on the matrices, then TensorFlow 1's Adam; gradients clipped with
tf.clip_by_global_norm; the warmup and cosine schedule fed per step).

Layers as TensorFlow users write them: tf.nn.moments for layer normalisation, tf.matmul
on [batch, heads, T, head width] for attention with an additive causal mask,
tf.nn.gelu(approximate=False), the token embedding reused (transposed) as the output layer.

--step-bench times --steps training steps after 5 warm-up steps and prints
{"bench": "tf_gpt", "tokens_per_s": ...}; without it, one "step N loss X" line per step.
--threads N sets intra_op_parallelism_threads (inter-op: 1).

  VENV/bin/python bench/peers/tf_gpt.py --step-bench --steps 200 --threads 1
"""
import argparse
import json
import math
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_gpt import Stream, add_common_args, load_text, schedule, windows  # noqa: E402  (no torch needed)


def main():
    ap = argparse.ArgumentParser()
    add_common_args(ap)
    ap.add_argument("--bf16", action="store_true",
                    help="TensorFlow's oneDNN bfloat16 rewrite (grappler's auto_mixed_precision_onednn_bfloat16)")
    a = ap.parse_args()
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    try:
        import numpy as np
        import tensorflow as tf
    except ImportError as e:
        print(json.dumps({"bench": "tf_gpt", "skipped": "no TensorFlow: %s" % e}))
        return 0
    tf1 = tf.compat.v1
    tf1.disable_eager_execution()
    data, n_train = load_text(a.data_dir)
    C, H, L, T, V, B = a.n_embd, a.n_head, a.n_layer, a.block, 256, a.batch
    Dh = C // H
    tf1.set_random_seed(a.seed)
    init = tf1.random_normal_initializer(0.0, 0.02)
    proj_init = tf1.random_normal_initializer(0.0, 0.02 / math.sqrt(2 * L))
    mats = []

    def var(name, shape, initializer, matrix):
        v = tf1.get_variable(name, shape, tf.float32, initializer)
        if matrix:
            mats.append(v)
        return v

    def layer_norm(x, name):
        g = var(name + "/gamma", [C], tf1.ones_initializer(), False)
        b = var(name + "/beta", [C], tf1.zeros_initializer(), False)
        mean, variance = tf.nn.moments(x, axes=[-1], keepdims=True)
        return (x - mean) * tf.math.rsqrt(variance + 1e-5) * g + b

    def dense(x, name, n_in, n_out, initializer):
        w = var(name + "/w", [n_in, n_out], initializer, True)
        b = var(name + "/b", [n_out], tf1.zeros_initializer(), False)
        return tf.reshape(tf.matmul(tf.reshape(x, [-1, n_in]), w) + b, [B, T, n_out])

    x_ph = tf1.placeholder(tf.int32, [B, T])
    y_ph = tf1.placeholder(tf.int32, [B, T])
    lr_ph = tf1.placeholder(tf.float32, [])
    wte = var("wte", [V, C], init, True)
    wpe = var("wpe", [T, C], init, True)
    h = tf.gather(wte, x_ph) + wpe
    mask = tf.constant(np.triu(np.full((T, T), -np.inf, np.float32), 1))
    for layer in range(L):
        p = "h%d/" % layer
        qkv = dense(layer_norm(h, p + "ln_1"), p + "attn", C, 3 * C, init)
        q, k, v = [tf.transpose(tf.reshape(t, [B, T, H, Dh]), [0, 2, 1, 3]) for t in tf.split(qkv, 3, axis=2)]
        att = tf.nn.softmax(tf.matmul(q, k, transpose_b=True) * (1.0 / math.sqrt(Dh)) + mask)
        o = tf.reshape(tf.transpose(tf.matmul(att, v), [0, 2, 1, 3]), [B, T, C])
        h = h + dense(o, p + "attn_proj", C, C, proj_init)
        f = tf.nn.gelu(dense(layer_norm(h, p + "ln_2"), p + "fc", C, 4 * C, init), approximate=False)
        h = h + dense(f, p + "mlp_proj", 4 * C, C, proj_init)
    h = layer_norm(h, "ln_f")
    logits = tf.matmul(tf.reshape(h, [-1, C]), wte, transpose_b=True)
    loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=tf.reshape(y_ph, [-1]),
                                                                         logits=logits))
    params = tf1.trainable_variables()
    grads = tf.gradients(loss, params)
    if a.clip > 0:
        grads, _ = tf.clip_by_global_norm(grads, a.clip)
    decay = tf.group(*[tf1.assign_sub(m, lr_ph * a.wd * m) for m in mats])
    with tf.control_dependencies([decay]):
        train = tf1.train.AdamOptimizer(lr_ph, 0.9, 0.99, 1e-8).apply_gradients(list(zip(grads, params)))
    cfg = tf1.ConfigProto(intra_op_parallelism_threads=a.threads, inter_op_parallelism_threads=1)
    if a.bf16:
        from tensorflow.core.protobuf import rewriter_config_pb2
        cfg.graph_options.rewrite_options.auto_mixed_precision_onednn_bfloat16 = rewriter_config_pb2.RewriterConfig.ON
    stream = Stream(a.seed)
    warm = 5 if a.step_bench else 0
    losses = []
    with tf1.Session(config=cfg) as sess:
        sess.run(tf1.global_variables_initializer())
        t0 = None
        for step in range(a.steps + warm):
            if step == warm:
                t0 = time.perf_counter()
            xs, ys = windows(data, n_train, stream, B, T)
            lr = schedule(step, a.lr, a.warmup, a.decay_steps, a.min_lr)
            lv, _ = sess.run([loss, train], {x_ph: np.array(xs, np.int32), y_ph: np.array(ys, np.int32), lr_ph: lr})
            losses.append(float(lv))
            if not a.step_bench:
                print("step %d loss %.6f" % (step + 1, lv))
        dt = time.perf_counter() - t0
    res = {"bench": "tf_gpt", "tensorflow": tf.__version__, "threads": a.threads, "steps": a.steps, "batch": B,
           "block": T, "n_layer": L, "n_embd": C, "first_loss": losses[0], "last_loss": losses[-1]}
    if a.step_bench:
        res["tokens_per_s"] = a.steps * B * T / dt
        res["bf16"] = a.bf16
        res["ms_per_step"] = 1000 * dt / a.steps
    print(json.dumps(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
