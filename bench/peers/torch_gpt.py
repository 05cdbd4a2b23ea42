#!/usr/bin/python3
"""PyTorch peer of gpt_replica (examples/gpt_replica.c, examples/common/gpt_model.c): the same
byte-level GPT, the same text, the same batches and the same optimizer, so that the losses of
the two can be compared step by step (bench/gpt_vs_torch.sh).

  text: the fortune files of /usr/share/games/fortunes whose names have no dot, sorted by
        name, concatenated; the first 90% trains
  batches: windows of block+1 bytes at offsets from gpt_model.c's xorshift64* stream
        (state seed * 0x9E3779B97F4A7C15 + 1; offset = next % (n_train - block - 1))
  model: token + position embeddings; n_layer pre-norm blocks (LayerNorm eps 1e-5, one qkv
        projection, causal softmax attention scaled by 1/sqrt(head width), a projection, a
        residual; LayerNorm, 4x MLP with the erf GELU, a projection, a residual); a final
        LayerNorm; logits through the token embedding (tied); mean cross entropy
  optimizer: AdamW as dg_adamw: var -= lr * wd * var for the matrices (rank >= 2), then
        TensorFlow 1's Adam (lr_t = lr sqrt(1 - b2^t) / (1 - b1^t); var -= lr_t m / (sqrt(v) +
        eps)); gradients first clipped at global norm --clip; lr = warmup then cosine
        (dg_warmup_cosine_decay) at the global step before the update

--checkpoint FILE takes the initial weights from distgraph's checkpoint of global step 0
(SQLite: tensors and chunks, float32 little-endian), so both start from the same numbers.
Without it the weights are drawn here (N(0, 0.02), projections N(0, 0.02/sqrt(2 n_layer))).
Prints one line per step, "step N loss X" (the loss of the step's batch before its update),
and a JSON line at the end. --step-bench times --steps training steps after 5 warm-up steps
and prints {"bench": "torch_gpt", "tokens_per_s": ...}. --eval_windows N adds the validation loss
after training ("val_loss"), over gpt_replica's N windows of the last 10% of the text. --sample-bench N decodes N new bytes
one position at a time with a key/value cache, as gpt_sample does (greedy; a full context
restarts the cache from its last half), and prints the decoder steps per second.

On a GPU (--device cuda): --sdpa computes the attention with F.scaled_dot_product_attention
(is_causal), --dropout P drops out where gpt_replica does (the embeddings, and each block's
two projections before their residual adds), --fused_adamw updates with torch.optim.AdamW's
fused kernel (decay on the matrices; its Adam is PyTorch's, not TensorFlow 1's, so losses
differ slightly: for speed only), --tf32 lets matrix products use TF32. With cuda the loss is
read from the GPU only at the end and the clipping norm stays on the GPU, so the host queues
steps ahead as a PyTorch user's loop does.

  python3 bench/peers/torch_gpt.py --device cuda --step-bench --steps 100 --batch 64 --block 256 \
      --n_layer 6 --n_head 6 --n_embd 384 --dropout 0.2 --sdpa --fused_adamw

  /usr/bin/python3 bench/peers/torch_gpt.py --checkpoint ckpt.db --steps 50 --threads 1
"""
import argparse
import json
import math
import os
import sqlite3
import sys
import time

MASK = (1 << 64) - 1


def load_text(data_dir):
    names = sorted(n for n in os.listdir(data_dir) if "." not in n)
    data = b"".join(open(os.path.join(data_dir, n), "rb").read() for n in names)
    return data, len(data) * 9 // 10


class Stream:
    def __init__(self, seed):
        self.s = (seed * 0x9E3779B97F4A7C15 + 1) & MASK

    def next(self):
        x = self.s
        x ^= x >> 12
        x ^= (x << 25) & MASK
        x ^= x >> 27
        self.s = x
        return (x * 0x2545F4914F6CDD1D) & MASK


def windows(data, n_train, stream, b, t):
    """The next batch of the stream: b windows of t + 1 bytes, as lists (inputs, targets)."""
    span = n_train - t - 1
    xs, ys = [], []
    for _ in range(b):
        off = stream.next() % span
        w = data[off:off + t + 1]
        xs.append(list(w[:t]))
        ys.append(list(w[1:]))
    return xs, ys


def batch(torch, data, n_train, stream, b, t):
    xs, ys = windows(data, n_train, stream, b, t)
    return torch.tensor(xs, dtype=torch.long), torch.tensor(ys, dtype=torch.long)


def add_common_args(ap):
    """The flags the GPT peers share (this file's, tf_gpt.py's and jax_gpt.py's)."""
    ap.add_argument("--data_dir", default="/usr/share/games/fortunes")
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--seed", type=int, default=1, help="the stream of worker 0 of gpt_replica --seed 1")
    ap.add_argument("--batch", type=int, default=12)
    ap.add_argument("--block", type=int, default=64)
    ap.add_argument("--n_layer", type=int, default=4)
    ap.add_argument("--n_head", type=int, default=4)
    ap.add_argument("--n_embd", type=int, default=128)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--decay_steps", type=int, default=1900, help="after the warmup (train steps - warmup)")
    ap.add_argument("--min_lr", type=float, default=1e-4)
    ap.add_argument("--wd", type=float, default=0.1)
    ap.add_argument("--clip", type=float, default=1.0)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--step-bench", action="store_true")


def read_checkpoint(path, step=0):
    import numpy as np
    db = sqlite3.connect(path)
    row = db.execute("SELECT id FROM checkpoints WHERE global_step = ?", (step,)).fetchone()
    if not row:
        raise SystemExit("torch_gpt: %s has no checkpoint of global step %d" % (path, step))
    out = {}
    for tid, name, dtype, dims in db.execute(
            "SELECT id, name, dtype, dims FROM tensors WHERE checkpoint_id = ?", (row[0],)):
        if dtype != 1:   # float32 only: the weights
            continue
        raw = b"".join(r[0] for r in db.execute("SELECT data FROM chunks WHERE tensor_id = ? ORDER BY seq", (tid,)))
        shape = [int(d) for d in dims.strip("[]").split(",") if d]
        out[name] = np.frombuffer(raw, dtype="<f4").reshape(shape).copy()
    return out


def draw_weights(torch, seed, C, L, T, V):
    """The model's weights drawn here (no checkpoint): N(0, 0.02), the residual projections
    N(0, 0.02/sqrt(2 n_layer)), biases 0, LayerNorm scales 1; named as gpt_model.c names them."""
    g = torch.Generator().manual_seed(seed)
    ps = 0.02 / math.sqrt(2 * L)
    w = {"wte": torch.randn(V, C, generator=g) * 0.02, "wpe": torch.randn(T, C, generator=g) * 0.02,
         "ln_f/gamma": torch.ones(C), "ln_f/beta": torch.zeros(C)}
    for l in range(L):
        p = "h%d/" % l
        for n, (i, o, s) in {"attn": (C, 3 * C, 0.02), "attn_proj": (C, C, ps), "fc": (C, 4 * C, 0.02),
                             "mlp_proj": (4 * C, C, ps)}.items():
            w[p + n + "/w"] = torch.randn(i, o, generator=g) * s
            w[p + n + "/b"] = torch.zeros(o)
        for n in ("ln_1", "ln_2"):
            w[p + n + "/gamma"] = torch.ones(C)
            w[p + n + "/beta"] = torch.zeros(C)
    return w


def schedule(step, peak, warmup, decay, final):
    if step < warmup:
        return peak * step / warmup
    f = min(1.0, (step - warmup) / decay)
    return final + (peak - final) * (1 + math.cos(math.pi * f)) / 2


def main():
    ap = argparse.ArgumentParser()
    add_common_args(ap)
    ap.add_argument("--checkpoint", default="")
    ap.add_argument("--autocast", choices=["off", "bf16"], default="off",
                    help="bf16: the forward pass under torch.autocast('cpu', bfloat16) (the peer of "
                         "gpt_replica --mixed_precision bf16)")
    ap.add_argument("--beta1", type=float, default=0.9)
    ap.add_argument("--beta2", type=float, default=0.99)
    ap.add_argument("--eps", type=float, default=1e-8)
    ap.add_argument("--sample-bench", type=int, default=0)
    ap.add_argument("--device", default="cpu", help="cpu or cuda")
    ap.add_argument("--sdpa", action="store_true", help="F.scaled_dot_product_attention instead of the composition")
    ap.add_argument("--dropout", type=float, default=0.0)
    ap.add_argument("--fused_adamw", action="store_true", help="torch.optim.AdamW(fused=True) (speed only)")
    ap.add_argument("--tf32", action="store_true", help="matrix products may use TF32 (cuda)")
    ap.add_argument("--eval_windows", type=int, default=0,
                    help="after training, the validation loss over this many windows (gpt_validation_loss's)")
    a = ap.parse_args()
    try:
        import torch
        import torch.nn.functional as F
    except ImportError as e:
        print(json.dumps({"bench": "torch_gpt", "skipped": "no PyTorch: %s" % e}))
        return 0
    torch.set_num_threads(a.threads)
    dev = torch.device(a.device)
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            print(json.dumps({"bench": "torch_gpt", "skipped": "torch.cuda.is_available() is false"}))
            return 0
        torch.backends.cuda.matmul.allow_tf32 = a.tf32
        torch.backends.cudnn.allow_tf32 = a.tf32
    data, n_train = load_text(a.data_dir)
    C, H, L, T, V = a.n_embd, a.n_head, a.n_layer, a.block, 256
    if a.checkpoint:
        w = {k: torch.from_numpy(v) for k, v in read_checkpoint(a.checkpoint).items()}
    else:
        w = draw_weights(torch, a.seed, C, L, T, V)
    names = ["wte", "wpe", "ln_f/gamma", "ln_f/beta"]
    for l in range(L):
        for n in ("ln_1/gamma", "ln_1/beta", "attn/w", "attn/b", "attn_proj/w", "attn_proj/b", "ln_2/gamma",
                  "ln_2/beta", "fc/w", "fc/b", "mlp_proj/w", "mlp_proj/b"):
            names.append("h%d/%s" % (l, n))
    params = {n: w[n].clone().float().to(dev).requires_grad_(True) for n in names}
    mask = torch.full((T, T), float("-inf")).triu(1).to(dev)
    drop = (lambda t: F.dropout(t, a.dropout, training=True)) if a.dropout > 0 else (lambda t: t)

    def forward(x, y):
        P = params
        h = drop(F.embedding(x, P["wte"]) + P["wpe"])
        B = x.shape[0]
        for l in range(L):
            p = "h%d/" % l
            a_in = F.layer_norm(h, (C,), P[p + "ln_1/gamma"], P[p + "ln_1/beta"], 1e-5)
            qkv = a_in @ P[p + "attn/w"] + P[p + "attn/b"]
            q, k, v = qkv.split(C, dim=2)
            q, k, v = (t.view(B, T, H, C // H).transpose(1, 2) for t in (q, k, v))
            if a.sdpa:
                o = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(B, T, C)
            else:
                att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(C // H)) + mask
                o = (att.softmax(-1) @ v).transpose(1, 2).reshape(B, T, C)
            h = h + drop(o @ P[p + "attn_proj/w"] + P[p + "attn_proj/b"])
            m_in = F.layer_norm(h, (C,), P[p + "ln_2/gamma"], P[p + "ln_2/beta"], 1e-5)
            f = F.gelu(m_in @ P[p + "fc/w"] + P[p + "fc/b"])
            h = h + drop(f @ P[p + "mlp_proj/w"] + P[p + "mlp_proj/b"])
        h = F.layer_norm(h, (C,), P["ln_f/gamma"], P["ln_f/beta"], 1e-5)
        logits = h @ P["wte"].t()
        return F.cross_entropy(logits.reshape(-1, V), y.reshape(-1))

    if a.sample_bench:
        return sample_bench(torch, F, params, a, C, H, L, T, V)
    m = {n: torch.zeros_like(p) for n, p in params.items()}
    v = {n: torch.zeros_like(p) for n, p in params.items()}
    b1p, b2p = torch.tensor(a.beta1, dtype=torch.float32), torch.tensor(a.beta2, dtype=torch.float32)
    if dev.type == "cuda":
        m = {n: t.to(dev) for n, t in m.items()}
        v = {n: t.to(dev) for n, t in v.items()}
        b1p, b2p = b1p.to(dev), b2p.to(dev)
    opt = None
    if a.fused_adamw:
        decay = [p for p in params.values() if p.dim() >= 2]
        rest = [p for p in params.values() if p.dim() < 2]
        opt = torch.optim.AdamW([{"params": decay, "weight_decay": a.wd}, {"params": rest, "weight_decay": 0.0}],
                                lr=a.lr, betas=(a.beta1, a.beta2), eps=a.eps, fused=True)
    stream = Stream(a.seed)
    losses = []
    warm = 5 if a.step_bench else 0
    t0 = None
    for step in range(a.steps + warm):
        if step == warm:
            t0 = time.perf_counter()
        x, y = batch(torch, data, n_train, stream, a.batch, T)
        if dev.type == "cuda":
            x, y = x.pin_memory().to(dev, non_blocking=True), y.pin_memory().to(dev, non_blocking=True)
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=a.autocast == "bf16"):
            loss = forward(x, y)
        for p in params.values():
            p.grad = None
        loss.backward()
        if opt is not None:
            if a.clip > 0:
                torch.nn.utils.clip_grad_norm_(list(params.values()), a.clip, foreach=True)
            for grp in opt.param_groups:
                grp["lr"] = schedule(step, a.lr, a.warmup, a.decay_steps, a.min_lr)
            opt.step()
            losses.append(loss.detach() if dev.type == "cuda" else float(loss))
            continue
        with torch.no_grad():
            gs = {n: p.grad for n, p in params.items()}
            if a.clip > 0 and dev.type == "cuda":   # the norm stays on the GPU
                norm = torch.sqrt(sum((g.double() ** 2).sum() for g in gs.values())).float()
                f = a.clip / torch.clamp(norm, min=a.clip)
                gs = {n: g * f for n, g in gs.items()}
            elif a.clip > 0:
                norm = math.sqrt(sum(float((g.double() ** 2).sum()) for g in gs.values()))
                f = a.clip / max(norm, a.clip)
                gs = {n: g * f for n, g in gs.items()}
            lr = torch.tensor(schedule(step, a.lr, a.warmup, a.decay_steps, a.min_lr), dtype=torch.float32, device=dev)
            lr_t = lr * torch.sqrt(1 - b2p) / (1 - b1p)
            for n, p in params.items():
                if p.dim() >= 2 and a.wd > 0:
                    p.sub_((lr * a.wd) * p)
                g = gs[n]
                m[n].mul_(a.beta1).add_((1 - a.beta1) * g)
                v[n].mul_(a.beta2).add_((1 - a.beta2) * g * g)
                p.sub_(lr_t * m[n] / (v[n].sqrt() + a.eps))
            b1p = b1p * a.beta1
            b2p = b2p * a.beta2
        losses.append(loss.detach() if dev.type == "cuda" else float(loss))
        if not a.step_bench:
            print("step %d loss %.6f" % (step + 1, float(loss)))
    if dev.type == "cuda":
        losses = [float(x) for x in losses]   # waits for the GPU
    dt = time.perf_counter() - t0
    val = None
    if a.eval_windows > 0:
        # gpt_validation_loss: window k of n starts at n_train + k * span / (n - 1), span =
        # len - n_train - block - 1 (integer division); the mean of every window's mean loss.
        n, span = a.eval_windows, len(data) - n_train - T - 1
        offs = [n_train + (k * span // (n - 1) if n > 1 else 0) for k in range(n)]
        with torch.no_grad():
            tot = 0.0
            for k0 in range(0, n, a.batch):
                ws = [data[o:o + T + 1] for o in offs[k0:k0 + a.batch]]
                x = torch.tensor([list(w[:T]) for w in ws], dtype=torch.long, device=dev)
                y = torch.tensor([list(w[1:]) for w in ws], dtype=torch.long, device=dev)
                with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=a.autocast == "bf16"):
                    tot += float(forward(x, y)) * len(ws)
            val = tot / n
    res = {"bench": "torch_gpt", "torch": torch.__version__, "device": a.device, "sdpa": a.sdpa, "dropout": a.dropout,
           "fused_adamw": a.fused_adamw, "tf32": a.tf32, "autocast": a.autocast, "threads": a.threads, "steps": a.steps,
           "batch": a.batch, "block": T, "n_layer": L, "n_embd": C, "first_loss": losses[0], "last_loss": losses[-1]}
    if val is not None:
        res["val_loss"] = val
        res["eval_windows"] = a.eval_windows
    if a.step_bench:
        res["tokens_per_s"] = a.steps * a.batch * T / dt
        res["ms_per_step"] = 1000 * dt / a.steps
    print(json.dumps(res))
    return 0


def sample_bench(torch, F, P, a, C, H, L, T, V):
    Dh = C // H

    def step(tok, pos, ks, vs):
        h = P["wte"][tok] + P["wpe"][pos]                  # [C]
        for l in range(L):
            p = "h%d/" % l
            x = F.layer_norm(h, (C,), P[p + "ln_1/gamma"], P[p + "ln_1/beta"], 1e-5)
            q, k, v = (x @ P[p + "attn/w"] + P[p + "attn/b"]).split(C)
            ks[l].append(k.view(H, Dh))
            vs[l].append(v.view(H, Dh))
            K = torch.stack(ks[l], 1)                       # [H, P, Dh]
            Vv = torch.stack(vs[l], 1)
            att = ((K @ q.view(H, Dh, 1)).squeeze(-1) / math.sqrt(Dh)).softmax(-1)   # [H, P]
            o = (att.unsqueeze(1) @ Vv).reshape(C)
            h = h + (o @ P[p + "attn_proj/w"] + P[p + "attn_proj/b"])
            x = F.layer_norm(h, (C,), P[p + "ln_2/gamma"], P[p + "ln_2/beta"], 1e-5)
            h = h + (F.gelu(x @ P[p + "fc/w"] + P[p + "fc/b"]) @ P[p + "mlp_proj/w"] + P[p + "mlp_proj/b"])
        h = F.layer_norm(h, (C,), P["ln_f/gamma"], P["ln_f/beta"], 1e-5)
        return h @ P["wte"].t()

    with torch.no_grad():
        ks, vs, hist, steps = [[] for _ in range(L)], [[] for _ in range(L)], [], 0
        nxt = 10   # the prompt: a newline
        t0 = time.perf_counter()
        for _ in range(a.sample_bench):
            if len(ks[0]) == T:   # full: keep the last half, read it in again
                hist = hist[-(T // 2):]
                ks, vs = [[] for _ in range(L)], [[] for _ in range(L)]
                for i, b in enumerate(hist):
                    step(b, i, ks, vs)
                    steps += 1
            logits = step(nxt, len(ks[0]), ks, vs)
            steps += 1
            hist.append(nxt)
            hist = hist[-T:]
            nxt = int(logits.argmax())
        dt = time.perf_counter() - t0
    print(json.dumps({"bench": "torch_gpt", "metric": "sample", "torch": torch.__version__, "threads": a.threads,
                      "new_bytes": a.sample_bench, "decoder_steps": steps, "steps_per_s": steps / dt}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
