"""The peer of bench/elastic_chaos.py: TensorFlow's ParameterServerStrategy with a
ClusterCoordinator (TensorFlow 2, in a venv with tensorflow-cpu). The 784-100-10 MLP of
mnist_replica (Adam, lr 0.01 as mnist_replica --learning_rate, batch 100) on Fashion-MNIST:
variables on the ps task, steps scheduled by the coordinator (the "chief" task) on the workers,
each worker reading its own copy of the training set.

  --role ps|worker --index I --cluster JSON     runs a tf.distribute.Server and serves
  --role chief --cluster JSON --steps N          the coordinator: schedules N steps, prints
                                                 "<unix time>: step N" after every 100 done and
                                                 "DONE accuracy=A" at the end

A worker that dies has its scheduled steps run again on the others; one that comes back on its
address is used again. A ps that dies fails the coordinator (TensorFlow's documented behaviour:
the coordinator must be restarted).
"""
import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fmnist_data  # noqa: E402

fmnist_data.set_thread_env(1)
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import tensorflow as tf  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--role", required=True)
    ap.add_argument("--index", type=int, default=0)
    ap.add_argument("--cluster", required=True, help='{"ps": [...], "worker": [...], "chief": [...]}')
    ap.add_argument("--steps", type=int, default=30000)
    ap.add_argument("--lr", type=float, default=0.01)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    cluster = tf.train.ClusterSpec(json.loads(a.cluster))
    if a.role in ("ps", "worker"):
        server = tf.distribute.Server(cluster, job_name=a.role, task_index=a.index, protocol="grpc", start=True)
        server.join()
        return
    resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(cluster, task_type="chief", task_id=0,
                                                                   rpc_layer="grpc")
    strategy = tf.distribute.ParameterServerStrategy(resolver)
    coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
    xtr, ytr, xte, yte = fmnist_data.load()
    xtr = xtr.reshape(-1, 784)
    xte = xte.reshape(-1, 784)
    tf.random.set_seed(a.seed)
    with strategy.scope():
        init = tf.keras.initializers.GlorotUniform(seed=a.seed)
        w1 = tf.Variable(init((784, 100)), name="w1")
        b1 = tf.Variable(tf.zeros([100]), name="b1")
        w2 = tf.Variable(init((100, 10)), name="w2")
        b2 = tf.Variable(tf.zeros([10]), name="b2")
        params = [w1, b1, w2, b2]
        ms = [tf.Variable(tf.zeros_like(p), name=p.name.split(":")[0] + "_m") for p in params]
        vs = [tf.Variable(tf.zeros_like(p), name=p.name.split(":")[0] + "_v") for p in params]
        t = tf.Variable(0.0, name="adam_t")

    def dataset_fn():
        ds = tf.data.Dataset.from_tensor_slices((xtr, ytr)).shuffle(60000, seed=a.seed).repeat().batch(100)
        return ds.prefetch(2)

    per_worker = coordinator.create_per_worker_dataset(dataset_fn)
    per_worker_iter = iter(per_worker)

    @tf.function
    def step(it):
        x, y = next(it)
        with tf.GradientTape() as tape:
            h = tf.nn.relu(tf.matmul(x, w1) + b1)
            logits = tf.matmul(h, w2) + b2
            loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits))
        grads = tape.gradient(loss, params)
        tn = t.assign_add(1.0)
        for p, g, m, v in zip(params, grads, ms, vs):
            m.assign(0.9 * m + 0.1 * g)
            v.assign(0.999 * v + 0.001 * g * g)
            mh = m / (1.0 - tf.pow(0.9, tn))
            vh = v / (1.0 - tf.pow(0.999, tn))
            p.assign_sub(a.lr * mh / (tf.sqrt(vh) + 1e-8))
        return loss

    done = 0
    while done < a.steps:
        n = min(100, a.steps - done)
        for _ in range(n):
            coordinator.schedule(step, args=(per_worker_iter,))
        coordinator.join()
        done += n
        print("%.6f: step %d" % (time.time(), done), flush=True)
    h = tf.nn.relu(tf.matmul(xte, w1) + b1)
    pred = tf.argmax(tf.matmul(h, w2) + b2, axis=1).numpy()
    print("DONE accuracy=%.4f" % float((pred == yte).mean()), flush=True)


if __name__ == "__main__":
    main()
