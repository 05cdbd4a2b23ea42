#!/usr/bin/env python3
"""PyTorch peer of gpu_bench's attention part: F.scaled_dot_product_attention with
is_causal=True in float32 on CUDA, q, k, v [16384 / T, 6 heads, T, 64], the forward pass and
the forward with the gradients of q, k and v for a given output gradient, timed as gpu_bench
times its fused attention: reps calls after three warm-ups, then one more with a wait for
the GPU, ms per call. PyTorch picks its kernel (the memory-efficient one for float32 on a
Hopper GPU); --math forces the unfused composition.

Prints JSON lines like gpu_bench:
  {"bench": "torch_attention_cuda", "metric": "attention", "t": 256, "fwd_ms": ..., "fwd_bwd_ms": ...}
Without CUDA it prints {"bench": "torch_attention_cuda", "skipped": "<reason>"} and exits 0.

  python3 bench/peers/torch_attention_cuda.py --t 256,1024 --reps 50
"""
import argparse
import json
import time


def emit(**kv):
    print(json.dumps({"bench": "torch_attention_cuda", **kv}), flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--t", default="256,1024", help="sequence lengths, comma-separated (batch 16384 / T)")
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--math", action="store_true", help="the unfused composition instead of a fused kernel")
    a = ap.parse_args()
    try:
        import torch
        import torch.nn.functional as F
    except ImportError as e:
        emit(skipped="no PyTorch: %s" % e)
        return 0
    if not torch.cuda.is_available():
        emit(skipped="torch.cuda.is_available() is false")
        return 0
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    dev = torch.device("cuda")
    emit(device=torch.cuda.get_device_name(0), torch=torch.__version__)
    for t in [int(x) for x in a.t.split(",")]:
        b, h, d = max(1, 16384 // t), 6, 64
        g = torch.Generator(device=dev).manual_seed(t)
        q, k, v, dy = (torch.rand(b, h, t, d, device=dev, generator=g) * 2 - 1 for _ in range(4))
        for x in (q, k, v):
            x.requires_grad_(True)

        def fwd():
            if a.math:
                with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.MATH):
                    return F.scaled_dot_product_attention(q, k, v, is_causal=True)
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)

        def fwd_bwd():
            y = fwd()
            torch.autograd.grad(y, (q, k, v), dy)

        res = {}
        for name, fn in (("fwd_ms", lambda: fwd().detach()), ("fwd_bwd_ms", fwd_bwd)):
            with torch.no_grad() if name == "fwd_ms" else torch.enable_grad():
                for _ in range(3):
                    fn()
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                for _ in range(a.reps + 1):
                    fn()
                torch.cuda.synchronize()
                res[name] = 1e3 * (time.perf_counter() - t0) / (a.reps + 1)
        flops = 2.0 * b * h * t * t * d
        emit(metric="attention", batch=b, heads=h, t=t, d=d, causal=True, math=a.math,
             fwd_ms=round(res["fwd_ms"], 4), fwd_bwd_ms=round(res["fwd_bwd_ms"], 4),
             fwd_tflops=round(flops / res["fwd_ms"] * 1e-9, 2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
