#!/usr/bin/env python3
"""JAX peer of gpt_replica (examples/gpt_replica.c), for speed: the same byte-level GPT
(bench/peers/torch_gpt.py describes it), one training step (forward, gradients, clipping at the
global norm, AdamW as dg_adamw) compiled whole by jax.jit (XLA on the CPU), on the same text and
batch stream, the learning rate of the warmup and cosine schedule passed in each step.

--threads N keeps the process on N cores (sched_setaffinity before JAX loads; with 1, XLA's
multithreaded Eigen off as well). --step-bench times --steps steps after 5 warm-up steps (the
first compiles) and prints {"bench": "jax_gpt", "tokens_per_s": ...}; without it, one
"step N loss X" line per step.

  VENV/bin/python bench/peers/jax_gpt.py --step-bench --steps 200 --threads 1
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
    a = ap.parse_args()
    cores = sorted(os.sched_getaffinity(0))[:max(1, a.threads)]
    os.sched_setaffinity(0, cores)
    if a.threads == 1:
        os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                                   " --xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1")
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    try:
        import jax
        import jax.numpy as jnp
        import numpy as np
    except ImportError as e:
        print(json.dumps({"bench": "jax_gpt", "skipped": "no JAX: %s" % e}))
        return 0
    data, n_train = load_text(a.data_dir)
    C, H, L, T, V, B = a.n_embd, a.n_head, a.n_layer, a.block, 256, a.batch
    Dh = C // H
    rng = np.random.default_rng(a.seed)
    ps = 0.02 / math.sqrt(2 * L)
    p = {"wte": rng.normal(0, 0.02, (V, C)), "wpe": rng.normal(0, 0.02, (T, C)),
         "ln_f/gamma": np.ones(C), "ln_f/beta": np.zeros(C)}
    for layer in range(L):
        pre = "h%d/" % layer
        for n, (i, o, s) in {"attn": (C, 3 * C, 0.02), "attn_proj": (C, C, ps), "fc": (C, 4 * C, 0.02),
                             "mlp_proj": (4 * C, C, ps)}.items():
            p[pre + n + "/w"] = rng.normal(0, s, (i, o))
            p[pre + n + "/b"] = np.zeros(o)
        for n in ("ln_1", "ln_2"):
            p[pre + n + "/gamma"] = np.ones(C)
            p[pre + n + "/beta"] = np.zeros(C)
    params = {k: jnp.asarray(v, jnp.float32) for k, v in p.items()}
    mask = jnp.asarray(np.triu(np.full((T, T), -np.inf, np.float32), 1))

    def layer_norm(x, g, b):
        mu = x.mean(-1, keepdims=True)
        var = ((x - mu) ** 2).mean(-1, keepdims=True)
        return (x - mu) * jax.lax.rsqrt(var + 1e-5) * g + b

    def loss_fn(P, x, y):
        h = P["wte"][x] + P["wpe"]
        for layer in range(L):
            pre = "h%d/" % layer
            qkv = layer_norm(h, P[pre + "ln_1/gamma"], P[pre + "ln_1/beta"]) @ P[pre + "attn/w"] + P[pre + "attn/b"]
            q, k, v = [t.reshape(B, T, H, Dh).transpose(0, 2, 1, 3) for t in jnp.split(qkv, 3, axis=2)]
            att = jax.nn.softmax(q @ k.transpose(0, 1, 3, 2) * (1.0 / math.sqrt(Dh)) + mask, axis=-1)
            o = (att @ v).transpose(0, 2, 1, 3).reshape(B, T, C)
            h = h + o @ P[pre + "attn_proj/w"] + P[pre + "attn_proj/b"]
            f = jax.nn.gelu(layer_norm(h, P[pre + "ln_2/gamma"], P[pre + "ln_2/beta"]) @ P[pre + "fc/w"] +
                            P[pre + "fc/b"], approximate=False)
            h = h + f @ P[pre + "mlp_proj/w"] + P[pre + "mlp_proj/b"]
        h = layer_norm(h, P["ln_f/gamma"], P["ln_f/beta"])
        logp = jax.nn.log_softmax(h.reshape(-1, C) @ P["wte"].T, axis=-1)
        return -jnp.take_along_axis(logp, y.reshape(-1, 1), axis=1).mean()

    def train_step(P, m, v, t, lr, x, y):
        loss, g = jax.value_and_grad(loss_fn)(P, x, y)
        if a.clip > 0:
            norm = jnp.sqrt(sum(jnp.sum(jnp.square(gi)) for gi in g.values()))
            f = a.clip / jnp.maximum(norm, a.clip)
            g = {k: gi * f for k, gi in g.items()}
        lr_t = lr * jnp.sqrt(1 - 0.99 ** t) / (1 - 0.9 ** t)
        newP, newm, newv = {}, {}, {}
        for k in P:
            w = P[k] - lr * a.wd * P[k] if P[k].ndim >= 2 and a.wd > 0 else P[k]
            newm[k] = 0.9 * m[k] + 0.1 * g[k]
            newv[k] = 0.99 * v[k] + 0.01 * g[k] * g[k]
            newP[k] = w - lr_t * newm[k] / (jnp.sqrt(newv[k]) + 1e-8)
        return newP, newm, newv, loss

    step_fn = jax.jit(train_step, donate_argnums=(0, 1, 2))
    m = {k: jnp.zeros_like(w) for k, w in params.items()}
    v = {k: jnp.zeros_like(w) for k, w in params.items()}
    stream = Stream(a.seed)
    warm = 5 if a.step_bench else 0
    losses = []
    t0 = None
    for step in range(a.steps + warm):
        if step == warm:
            t0 = time.perf_counter()
        xs, ys = windows(data, n_train, stream, B, T)
        lr = schedule(step, a.lr, a.warmup, a.decay_steps, a.min_lr)
        params, m, v, loss = step_fn(params, m, v, jnp.float32(step + 1), jnp.float32(lr),
                                     jnp.asarray(np.array(xs, np.int32)), jnp.asarray(np.array(ys, np.int32)))
        lv = float(loss)   # waits for the step
        losses.append(lv)
        if not a.step_bench:
            print("step %d loss %.6f" % (step + 1, lv))
    dt = time.perf_counter() - t0
    res = {"bench": "jax_gpt", "jax": jax.__version__, "threads": a.threads, "steps": a.steps, "batch": B,
           "block": T, "n_layer": L, "n_embd": C, "first_loss": losses[0], "last_loss": losses[-1]}
    if a.step_bench:
        res["tokens_per_s"] = a.steps * B * T / dt
        res["ms_per_step"] = 1000 * dt / a.steps
    print(json.dumps(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
