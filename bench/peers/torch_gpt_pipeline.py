#!/usr/bin/python3
"""PyTorch peer of gpt_replica --pipeline_stages (bench/pipeline_bench.sh): the same byte-level
GPT as torch_gpt.py, cut into the same stages (stage 0 the embeddings, the last the final
LayerNorm, the tied output projection and the loss, the blocks shared out as
gpt_build_pipeline does), one process per stage over gloo on 127.0.0.1, a global batch run as
--micro_batches micro-batches under GPipe or 1F1B written on torch.distributed's isend/irecv
(torch.distributed.pipelining needs PyTorch 2.4; Debian's is older). As in Megatron, the first
and the last stage each hold the tied token embedding and all-reduce its gradient; the
gradients are clipped at a global norm taken over every stage; AdamW (betas 0.9, 0.99, weight
decay on the matrices) applies once a step. Each process uses --threads threads.

Prints {"bench": "torch_gpt_pipeline", "steps_per_s": ...} after --steps timed steps (after
--warm steps), from stage 0.

  /usr/bin/python3 bench/peers/torch_gpt_pipeline.py --stages 2 --micro_batches 8 --batch 64
"""
import argparse
import json
import math
import os
import socket
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_gpt import Stream, add_common_args, draw_weights, load_text, windows  # noqa: E402


def stage_blocks(k, stages, n_layer):
    return range(k * n_layer // stages, (k + 1) * n_layer // stages)


def run(rank, a, port):
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    torch.set_num_threads(a.threads)
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=a.stages)
    p, m = a.stages, a.micro_batches
    first, last = rank == 0, rank == p - 1
    ends = dist.new_group([0, p - 1]) if p > 1 else None
    C, H, L, T, V = a.n_embd, a.n_head, a.n_layer, a.block, 256
    full = draw_weights(torch, a.seed, C, L, T, V)
    blocks = list(stage_blocks(rank, p, L))
    names = [k for k in full if any(k.startswith("h%d/" % l) for l in blocks)]
    if first:
        names += ["wte", "wpe"]
    if last:
        names += ["ln_f/gamma", "ln_f/beta"] + ([] if first else ["wte"])
    P = {n: full[n].clone().requires_grad_(True) for n in names}
    mask = torch.full((T, T), float("-inf")).triu(1)

    def forward(x, y):
        if first:
            h = F.embedding(x, P["wte"]) + P["wpe"]
        else:
            h = x
        B = h.shape[0]
        for l in blocks:
            pre = "h%d/" % l
            a_in = F.layer_norm(h, (C,), P[pre + "ln_1/gamma"], P[pre + "ln_1/beta"], 1e-5)
            q, k, v = (a_in @ P[pre + "attn/w"] + P[pre + "attn/b"]).split(C, dim=2)
            q, k, v = (t.view(B, T, H, C // H).transpose(1, 2) for t in (q, k, v))
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(C // H)) + mask
            o = (att.softmax(-1) @ v).transpose(1, 2).reshape(B, T, C)
            h = h + (o @ P[pre + "attn_proj/w"] + P[pre + "attn_proj/b"])
            m_in = F.layer_norm(h, (C,), P[pre + "ln_2/gamma"], P[pre + "ln_2/beta"], 1e-5)
            h = h + (F.gelu(m_in @ P[pre + "fc/w"] + P[pre + "fc/b"]) @ P[pre + "mlp_proj/w"] + P[pre + "mlp_proj/b"])
        if not last:
            return h
        h = F.layer_norm(h, (C,), P["ln_f/gamma"], P["ln_f/beta"], 1e-5)
        return F.cross_entropy((h @ P["wte"].t()).reshape(-1, V), y.reshape(-1)) / m

    decay = [t for n, t in P.items() if t.dim() >= 2]
    other = [t for n, t in P.items() if t.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": a.wd}, {"params": other, "weight_decay": 0.0}],
                            lr=a.lr, betas=(0.9, 0.99), eps=1e-8)
    data, n_train = load_text(a.data_dir)
    stream = Stream(a.seed)
    mb = a.batch // m

    def step():
        xs, ys = windows(data, n_train, stream, a.batch, T)
        x = torch.tensor(xs, dtype=torch.long).split(mb)
        y = torch.tensor(ys, dtype=torch.long).split(mb)
        ins, outs, pending = [None] * m, [None] * m, []

        def fwd(i):
            if first:
                inp = x[i]
            else:
                inp = torch.empty(mb, T, C)
                dist.recv(inp, rank - 1)
                inp.requires_grad_(True)
            out = forward(inp, y[i])
            if not last:
                pending.append(dist.isend(out.detach(), rank + 1))
            ins[i], outs[i] = inp, out

        def bwd(i):
            if last:
                outs[i].backward()
            else:
                grad = torch.empty(mb, T, C)
                dist.recv(grad, rank + 1)
                outs[i].backward(grad)
            if not first:
                pending.append(dist.isend(ins[i].grad, rank - 1))
            ins[i] = outs[i] = None

        if a.schedule == "gpipe":
            for i in range(m):
                fwd(i)
            for i in range(m):
                bwd(i)
        else:
            warm = min(p - 1 - rank, m)
            for i in range(warm):
                fwd(i)
            for j in range(m - warm):
                fwd(warm + j)
                bwd(j)
            for j in range(m - warm, m):
                bwd(j)
        for w in pending:
            w.wait()
        if p > 1 and (first or last):   # the tied embedding's two copies: one gradient
            dist.all_reduce(P["wte"].grad, group=ends)
        sq = torch.zeros(1)
        for n, t in P.items():
            if n != "wte" or first:   # count the shared table once
                sq += t.grad.pow(2).sum()
        if p > 1:
            dist.all_reduce(sq)
        scale = min(1.0, a.clip / (math.sqrt(float(sq)) + 1e-6))
        for t in P.values():
            t.grad.mul_(scale)
        opt.step()
        opt.zero_grad(set_to_none=False)

    for _ in range(a.warm):
        step()
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(a.steps):
        step()
    dist.barrier()
    dt = time.perf_counter() - t0
    if first:
        print(json.dumps({"bench": "torch_gpt_pipeline", "torch": torch.__version__, "stages": p, "micro_batches": m,
                          "schedule": a.schedule, "batch": a.batch, "steps": a.steps,
                          "steps_per_s": round(a.steps / dt, 3)}), flush=True)
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser()
    add_common_args(ap)
    ap.add_argument("--stages", type=int, default=2)
    ap.add_argument("--micro_batches", type=int, default=8)
    ap.add_argument("--schedule", choices=["gpipe", "1f1b"], default="1f1b")
    ap.add_argument("--warm", type=int, default=5)
    a = ap.parse_args()
    try:
        import torch.multiprocessing as mp
    except ImportError as e:
        print(json.dumps({"bench": "torch_gpt_pipeline", "skipped": "no PyTorch: %s" % e}))
        return 0
    if a.batch % a.micro_batches or a.stages < 1 or a.stages > a.n_layer:
        raise SystemExit("torch_gpt_pipeline: --batch must divide by --micro_batches; 1 <= --stages <= --n_layer")
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    mp.spawn(run, args=(a, port), nprocs=a.stages, join=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
