#!/usr/bin/env python3
"""PyTorch peer of gpu_bench's MLP part: the MNIST-replica model (784 -> 100 ReLU -> 10,
softmax cross entropy averaged over the batch, Adam lr 0.01 with TensorFlow's betas and
epsilon, weights truncated normal with stddev 1/sqrt(fan_in), zero biases) trained on CUDA
with synthetic data fed from host memory every step, as gpu_bench does.

Prints JSON lines like gpu_bench:
  {"bench": "torch_mlp_cuda", "metric": "mlp_step", "batch": 100, "value": <ms>, "unit": "ms", ...}
Compare each line's value with gpu_bench's {"metric": "mlp_step"} line of the same batch.
Without CUDA it prints {"bench": "torch_mlp_cuda", "skipped": "<reason>"} and exits 0.

  python3 bench/peers/torch_mlp_cuda.py --batches 100,1000,10000 --steps 200 --warmup 20
"""
import argparse
import json
import math
import time


def emit(**kv):
    print(json.dumps({"bench": "torch_mlp_cuda", **kv}), flush=True)


def truncated_normal_(t, std, gen):
    # TensorFlow's truncated normal: redraw anything beyond two standard deviations.
    import torch
    with torch.no_grad():
        t.normal_(0.0, std, generator=gen)
        while True:
            bad = t.abs() > 2 * std
            n = int(bad.sum())
            if n == 0:
                break
            t[bad] = torch.empty(n, device=t.device).normal_(0.0, std, generator=gen)


def bench_batch(torch, batch, steps, warmup, hidden, lr, dev):
    pixels, classes = 784, 10
    gen = torch.Generator(device=dev)
    gen.manual_seed(1)
    hid_w = torch.empty(pixels, hidden, device=dev)
    sm_w = torch.empty(hidden, classes, device=dev)
    truncated_normal_(hid_w, 1.0 / math.sqrt(pixels), gen)
    truncated_normal_(sm_w, 1.0 / math.sqrt(hidden), gen)
    hid_b = torch.zeros(hidden, device=dev)
    sm_b = torch.zeros(classes, device=dev)
    params = [hid_w, hid_b, sm_w, sm_b]
    for p in params:
        p.requires_grad_(True)
    opt = torch.optim.Adam(params, lr=lr, betas=(0.9, 0.999), eps=1e-8)

    # Host data, copied to the GPU every step like a fed placeholder.
    cpu_gen = torch.Generator()
    cpu_gen.manual_seed(2)
    x_host = torch.rand(batch, pixels, generator=cpu_gen)
    y_host = torch.randint(0, classes, (batch,), generator=cpu_gen)

    def step():
        x = x_host.to(dev)
        y = y_host.to(dev)
        hid = torch.relu(x @ hid_w + hid_b)
        logits = hid @ sm_w + sm_b
        loss = torch.nn.functional.cross_entropy(logits, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return loss

    for _ in range(warmup):
        step()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(steps):
        loss = step()
    last = float(loss.item())  # waits for the GPU, like gpu_bench's final fetch of the loss
    ms = (time.perf_counter() - t0) * 1e3 / steps
    emit(metric="mlp_step", batch=batch, value=round(ms, 4), unit="ms",
         steps_per_s=round(1e3 / ms, 1), steps=steps, loss=round(last, 4),
         device=torch.cuda.get_device_name(dev), torch=torch.__version__)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batches", default="100,1000,10000")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--hidden_units", type=int, default=100)
    ap.add_argument("--learning_rate", type=float, default=0.01)
    args = ap.parse_args()
    batches = [int(b) for b in args.batches.split(",") if b]
    if args.steps < 1 or args.warmup < 0 or not batches or min(batches) < 1:
        ap.error("--steps >= 1, --warmup >= 0, --batches positive integers")
    try:
        import torch
    except ImportError as e:
        emit(skipped="no PyTorch: %s" % e)
        return 0
    if not torch.cuda.is_available():
        emit(skipped="torch.cuda.is_available() is False (torch %s)" % torch.__version__)
        return 0
    # TF32 off: gpu_bench's MatMuls are plain float32 (cuBLAS default math).
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    dev = torch.device("cuda:0")
    for b in batches:
        bench_batch(torch, b, args.steps, args.warmup, args.hidden_units, args.learning_rate, dev)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
