"""The peer of bench/elastic_chaos.py: TorchElastic. Training script for torchrun: the
784-100-10 MLP of mnist_replica (Adam, lr 0.01, batch 100 per worker) on Fashion-MNIST under
DistributedDataParallel over gloo, with the checkpoint TorchElastic asks its users to keep (rank 0
saves the model, the optimizer and the step every --save_every steps; every worker loads it when
it starts). A worker that dies makes torchrun restart every worker of the group, which go on from
the checkpoint: the steps since it are redone.

Prints "<unix time>: step N" every --log_every steps and "RESTORED <unix time> step N" on a start
from a checkpoint, "DONE accuracy=A" at the end (rank 0).

  torchrun --nnodes 1:4 --nproc_per_node 1 --max_restarts 20 --rdzv_backend c10d \
      --rdzv_endpoint 127.0.0.1:PORT --rdzv_id job bench/peers/torch_elastic.py --steps 30000 --ckpt DIR/ckpt.pt
"""
import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fmnist_data  # noqa: E402

fmnist_data.set_thread_env(1)
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=30000)
    ap.add_argument("--save_every", type=int, default=100)
    ap.add_argument("--log_every", type=int, default=10)
    ap.add_argument("--ckpt", required=True)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    xtr, ytr, xte, yte = fmnist_data.load()
    xtr = torch.from_numpy(xtr.reshape(-1, 784))
    ytr = torch.from_numpy(ytr)
    torch.manual_seed(a.seed)
    model = torch.nn.Sequential(torch.nn.Linear(784, 100), torch.nn.ReLU(), torch.nn.Linear(100, 10))
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    step = 0
    if os.path.exists(a.ckpt):
        st = torch.load(a.ckpt)
        model.load_state_dict(st["model"])
        opt.load_state_dict(st["opt"])
        step = st["step"]
        print("RESTORED %.6f step %d world %d" % (time.time(), step, world), flush=True)
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    sampler = fmnist_data.BatchSampler(60000, 100, a.seed + rank + 1000 * int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")))
    loss_fn = torch.nn.CrossEntropyLoss()
    while step < a.steps:
        idx = torch.from_numpy(sampler.next())
        opt.zero_grad()
        loss = loss_fn(ddp(xtr[idx]), ytr[idx])
        loss.backward()
        opt.step()
        step += 1
        if step % a.log_every == 0:
            print("%.6f: step %d" % (time.time(), step), flush=True)
        if rank == 0 and step % a.save_every == 0:
            tmp = a.ckpt + ".tmp"
            torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step}, tmp)
            os.replace(tmp, a.ckpt)
    if rank == 0:
        with torch.no_grad():
            pred = model(torch.from_numpy(xte.reshape(-1, 784))).argmax(1).numpy()
        print("DONE accuracy=%.4f" % float((pred == yte).mean()), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
