"""The 1024-wide MLP of step_bench --model wide (784-1024-1024-10, ReLU, Adam 1e-3, sparse softmax
cross entropy) in PyTorch or TensorFlow, timed as step_bench times it: one fixed batch of
Fashion-MNIST, warm-up steps, then the median of the timed steps. Prints median_ms=... and a
JSON line.

  --framework torch [--autocast bf16]   Debian's python3-torch; bf16: the forward pass under
                                        torch.autocast("cpu", bfloat16), the backward after it
  --framework tf [--bf16]               tensorflow-cpu (tf.compat.v1 graph mode); --bf16:
                                        grappler's auto_mixed_precision_onednn_bfloat16 rewrite

  /usr/bin/python3 bench/peers/wide_mlp.py --framework torch --autocast bf16
  VENV/bin/python bench/peers/wide_mlp.py --framework tf --bf16
"""
import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fmnist_data  # noqa: E402


def batch_of(bs):
    xtr, ytr, _, _ = fmnist_data.load()
    return xtr[:bs].reshape(bs, 784), ytr[:bs]


def run_torch(a, x, y):
    import torch
    torch.set_num_threads(a.threads)
    torch.manual_seed(1)
    net = torch.nn.Sequential(torch.nn.Linear(784, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 1024),
                              torch.nn.ReLU(), torch.nn.Linear(1024, 10))
    opt = torch.optim.Adam(net.parameters(), lr=1e-3)
    xt = torch.tensor(x, dtype=torch.float32)
    yt = torch.tensor(y, dtype=torch.int64)
    lossf = torch.nn.CrossEntropyLoss()
    times = []
    for i in range(a.warmup + a.steps):
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=a.autocast == "bf16"):
            loss = lossf(net(xt), yt)
        loss.backward()
        opt.step()
        if i >= a.warmup:
            times.append(time.perf_counter() - t0)
    return {"framework": "torch", "version": torch.__version__, "autocast": a.autocast}, times, float(loss)


def run_tf(a, x, y):
    import numpy as np
    import tensorflow as tf
    tf1 = tf.compat.v1
    tf1.disable_eager_execution()
    tf1.set_random_seed(1)
    x_ph = tf1.placeholder(tf.float32, [None, 784])
    y_ph = tf1.placeholder(tf.int64, [None])
    init = tf1.glorot_uniform_initializer()

    def dense(h, n_in, n_out, name):
        w = tf1.get_variable(name + "/kernel", [n_in, n_out], initializer=init)
        b = tf1.get_variable(name + "/bias", [n_out], initializer=tf1.zeros_initializer())
        return tf.nn.bias_add(tf.matmul(h, w), b)

    h = tf.nn.relu(dense(x_ph, 784, 1024, "fc1"))
    h = tf.nn.relu(dense(h, 1024, 1024, "fc2"))
    logits = dense(h, 1024, 10, "logits")
    loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y_ph, logits=logits))
    train = tf1.train.AdamOptimizer(1e-3).minimize(loss)
    cfg = tf1.ConfigProto(intra_op_parallelism_threads=a.threads, inter_op_parallelism_threads=1)
    if a.bf16:
        from tensorflow.core.protobuf import rewriter_config_pb2
        cfg.graph_options.rewrite_options.auto_mixed_precision_onednn_bfloat16 = rewriter_config_pb2.RewriterConfig.ON
    feed = {x_ph: np.asarray(x, np.float32), y_ph: np.asarray(y, np.int64)}
    times = []
    with tf1.Session(config=cfg) as sess:
        sess.run(tf1.global_variables_initializer())
        for i in range(a.warmup + a.steps):
            t0 = time.perf_counter()
            lv, _ = sess.run([loss, train], feed)
            if i >= a.warmup:
                times.append(time.perf_counter() - t0)
    return {"framework": "tf", "version": tf.__version__, "bf16": a.bf16}, times, float(lv)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--framework", choices=["torch", "tf"], required=True)
    ap.add_argument("--autocast", choices=["off", "bf16"], default="off")
    ap.add_argument("--bf16", action="store_true")
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args()
    x, y = batch_of(a.batch_size)
    info, times, last = (run_torch if a.framework == "torch" else run_tf)(a, x, y)
    med = 1000 * statistics.median(times)
    info.update({"bench": "wide_mlp", "batch": a.batch_size, "threads": a.threads, "steps": a.steps,
                 "median_ms": round(med, 4), "last_loss": last})
    print("median_ms=%.4f" % med)
    print(json.dumps(info))
    return 0


if __name__ == "__main__":
    sys.exit(main())
