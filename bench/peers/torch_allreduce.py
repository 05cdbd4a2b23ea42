#!/usr/bin/env python3
"""The peer of bench/allreduce_bench.c: all-reduce (sum) of float32 buffers between N
processes on 127.0.0.1 with torch.distributed's gloo backend, the same sizes and iteration
counts, the same JSON lines with "impl":"gloo".

    /usr/bin/python3 bench/peers/torch_allreduce.py --nprocs 2,4 --max_bytes 268435456
"""
import argparse
import json
import os
import socket
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def iterations(nbytes, scale):
    it = (64 << 20) * scale // max(nbytes, 1)
    return max(3, min(200, it))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_rank(rank, n, port, min_bytes, max_bytes, scale, threads):
    torch.set_num_threads(threads)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=n)
    nbytes = min_bytes
    while nbytes <= max_bytes:
        length = nbytes // 4
        base = (torch.arange(length, dtype=torch.int64) % 7).to(torch.float32)
        t = base + float(rank + 1)
        # Check once, then warm up before timing.
        x = t.clone()
        dist.all_reduce(x)
        want = base * n + float(n * (n + 1) // 2)
        if not torch.equal(x, want):
            print(f"torch_allreduce rank {rank}: wrong result at {nbytes} bytes", file=sys.stderr)
            sys.exit(1)
        iters = iterations(nbytes, scale)
        for _ in range(2):
            x.copy_(t)
            dist.all_reduce(x)
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(iters):
            # All-reduce works in place; distgraph's reads its input and writes a new output,
            # so the input is not restored between runs (the sum grows, the time does not).
            dist.all_reduce(x)
        ms = (time.perf_counter() - t0) * 1e3 / iters
        if rank == 0:
            algbw = nbytes / (ms * 1e-3) / 1e9
            print(json.dumps({"bench": "allreduce", "impl": "gloo", "nprocs": n, "bytes": nbytes,
                              "time_ms": round(ms, 4), "algbw_GBps": round(algbw, 4),
                              "busbw_GBps": round(algbw * 2 * (n - 1) / n, 4), "iters": iters},
                             separators=(",", ":")), flush=True)
        nbytes *= 4
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--nprocs", default="2,3,4")
    ap.add_argument("--min_bytes", type=int, default=4096)
    ap.add_argument("--max_bytes", type=int, default=256 << 20)
    ap.add_argument("--scale", type=int, default=1)
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads per process")
    a = ap.parse_args()
    for tok in a.nprocs.split(","):
        n = int(tok)
        mp.spawn(run_rank, args=(n, free_port(), a.min_bytes, a.max_bytes, a.scale, a.threads), nprocs=n, join=True)


if __name__ == "__main__":
    main()
