#!/usr/bin/python3
"""PyTorch peer of the cnn_replica example, single process on the CPU (or --device cuda): the small CNN on
Fashion-MNIST (Debian's dataset-fashion-mnist files, pixels/255 in [0,1]):

  conv 5x5 1->16 SAME + bias, ReLU, maxpool 2x2/2   -> 14x14x16
  conv 5x5 16->32 SAME + bias, ReLU, maxpool 2x2/2  -> 7x7x32, flatten 1568
  dense 1568->128 ReLU, dropout 0.25 (training only), dense 128->10 logits
  loss: mean sparse softmax cross-entropy over the batch
  Adam (0.9, 0.999, eps 1e-8), lr 0.001 * 0.95^(step/500) (continuous exponential decay)
  Glorot-uniform kernels, zero biases, seeded; batch 100.

The network is NCHW here ([N,1,28,28]); it is the same network as the NHWC one, only the
flatten order before the first dense layer differs, which does not matter for timing.

--step-bench times single training steps on one fixed batch (the first training images)
after 20 warm-up steps and prints one JSON line:
  {"bench": "torch_cnn", "metric": "cnn_step", "batch": 100, "threads": 1, "value": <mean ms>,
   "median_ms": ..., "unit": "ms", "steps": N, "torch": "<version>", ...}
Otherwise it trains --steps on epoch-shuffled random batches and prints a JSON line with
"metric": "cnn_train", steps_per_s (training loop only, data loading excluded),
test_accuracy and test_cross_entropy on the 10,000 test images (dropout off).
Without PyTorch (or without the data files) it prints {"bench": "torch_cnn", "skipped": ...}
and exits 0. Run it with Debian's interpreter (python3-torch):

  /usr/bin/python3 bench/peers/torch_cnn.py --step-bench --threads 1
  /usr/bin/python3 bench/peers/torch_cnn.py --steps 3000 --threads 1
  python3 bench/peers/torch_cnn.py --step-bench --device cuda   (scripts/gpu_check.sh)
"""
import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fmnist_data  # noqa: E402  (nothing heavy at import)

WARMUP = 20
EVAL_CHUNK = 1000


def emit(**kv):
    print(json.dumps({"bench": "torch_cnn", **kv}), flush=True)


def fix_glibc_malloc():
    """Fixed glibc malloc thresholds (mmap 32 MiB, the most glibc allows; trim 512 MiB).
    With glibc's dynamic thresholds some processes keep mmap()ing and unmapping the step's
    large buffers (about 6,000 page faults a step here) and run ~45% slower for their whole
    life (bimodal: ~25 ms or ~37 ms a step on the 2-core test machine). Returns True if set."""
    import ctypes
    try:
        libc = ctypes.CDLL("libc.so.6")
        M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
        return bool(libc.mallopt(M_MMAP_THRESHOLD, 32 << 20)) and \
            bool(libc.mallopt(M_TRIM_THRESHOLD, 512 << 20))
    except (OSError, AttributeError):
        return False


def build(torch, seed):
    nn = torch.nn
    torch.manual_seed(seed)
    model = nn.Sequential(
        nn.Conv2d(1, 16, 5, stride=1, padding=2), nn.ReLU(), nn.MaxPool2d(2, 2),
        nn.Conv2d(16, 32, 5, stride=1, padding=2), nn.ReLU(), nn.MaxPool2d(2, 2),
        nn.Flatten(),
        nn.Linear(7 * 7 * 32, 128), nn.ReLU(),
        nn.Dropout(0.25),
        nn.Linear(128, 10),
    )
    with torch.no_grad():
        for m in model:
            if isinstance(m, (nn.Conv2d, nn.Linear)):
                # fan_in = in*kh*kw, fan_out = out*kh*kw, as TensorFlow's glorot_uniform.
                nn.init.xavier_uniform_(m.weight)
                m.bias.zero_()
    return model


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=1,
                    help="torch intra-op threads (inter-op is always 1)")
    ap.add_argument("--batch-size", type=int, default=100)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--steps", type=int, default=3000, help="training steps")
    ap.add_argument("--step-bench", action="store_true",
                    help="time steps on one fixed batch instead of training")
    ap.add_argument("--bench-steps", type=int, default=200,
                    help="timed steps of --step-bench (after %d warm-up steps)" % WARMUP)
    ap.add_argument("--device", default="cpu",
                    help="cpu or cuda (cuda: the batch is copied from host memory every step, "
                         "and each timed step waits for the device)")
    ap.add_argument("--glibc-malloc-default", action="store_true",
                    help="leave glibc's dynamic mmap/trim thresholds (by default they are fixed)")
    args = ap.parse_args()
    if not 1 <= args.threads <= 1024:
        ap.error("--threads must be in 1..1024")
    if not 1 <= args.batch_size <= 60000:
        ap.error("--batch-size must be in 1..60000")
    if not 0 <= args.seed < 2 ** 31:
        ap.error("--seed must be in 0..2^31-1")
    if not 1 <= args.steps <= 10_000_000:
        ap.error("--steps must be in 1..10000000")
    if args.device not in ("cpu", "cuda"):
        ap.error("--device must be cpu or cuda")
    if not 1 <= args.bench_steps <= 1_000_000:
        ap.error("--bench-steps must be in 1..1000000")

    fmnist_data.set_thread_env(args.threads)  # before torch loads OpenMP / BLAS
    mallopt = False if args.glibc_malloc_default else fix_glibc_malloc()
    try:
        import numpy as np  # noqa: F401
        import torch
        import torch.nn.functional as F
    except ImportError as e:
        emit(skipped="no PyTorch/numpy: %s" % e)
        return 0
    missing = fmnist_data.missing_files()
    if missing:
        emit(skipped="Fashion-MNIST files missing in %s: %s" % (fmnist_data.DATA_DIR, missing))
        return 0
    if args.device == "cuda" and not torch.cuda.is_available():
        emit(skipped="no CUDA device")
        return 0
    torch.set_num_threads(args.threads)
    torch.set_num_interop_threads(1)
    dev = torch.device(args.device)
    sync = torch.cuda.synchronize if args.device == "cuda" else (lambda: None)

    t0 = time.perf_counter()
    xtr_np, ytr_np, xte_np, yte_np = fmnist_data.load()
    # NHWC -> NCHW, contiguous once so that indexing a batch gives a contiguous batch.
    xtr = torch.from_numpy(xtr_np.transpose(0, 3, 1, 2).copy())
    xte = torch.from_numpy(xte_np.transpose(0, 3, 1, 2).copy())
    ytr, yte = torch.from_numpy(ytr_np), torch.from_numpy(yte_np)
    load_s = time.perf_counter() - t0

    model = build(torch, args.seed).to(dev)
    model.train()
    opt = torch.optim.Adam(model.parameters(), lr=0.001, betas=(0.9, 0.999), eps=1e-8)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 0.95 ** (step / 500.0))
    lead = dict(batch=args.batch_size, threads=args.threads, device=args.device)
    tail_kv = dict(torch_threads=torch.get_num_threads(), mallopt=mallopt,
                   torch=torch.__version__)

    def step(x, y):
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(x.to(dev, non_blocking=True)), y.to(dev, non_blocking=True))
        loss.backward()
        opt.step()
        sched.step()
        return loss

    if args.step_bench:
        x, y = xtr[:args.batch_size], ytr[:args.batch_size]
        times = []
        for i in range(WARMUP + args.bench_steps):
            s = time.perf_counter()
            step(x, y)
            sync()
            if i >= WARMUP:
                times.append((time.perf_counter() - s) * 1e3)
        mean, med, p10, p90 = fmnist_data.stats(times)
        emit(metric="cnn_step", **lead, value=round(mean, 4), median_ms=round(med, 4),
             p10_ms=round(p10, 4), p90_ms=round(p90, 4), unit="ms", steps=len(times),
             warmup=WARMUP, **tail_kv)
        return 0

    sampler = fmnist_data.BatchSampler(xtr.shape[0], args.batch_size, args.seed)
    tail = []
    t_start = time.perf_counter()
    for i in range(args.steps):
        idx = torch.from_numpy(sampler.next())
        loss = step(xtr[idx], ytr[idx])
        if i >= args.steps - 100:
            tail.append(loss.item())
    sync()
    train_s = time.perf_counter() - t_start

    model.eval()
    correct, ce_sum = 0, 0.0
    with torch.no_grad():
        for lo in range(0, xte.shape[0], EVAL_CHUNK):
            logits = model(xte[lo:lo + EVAL_CHUNK].to(dev))
            yc = yte[lo:lo + EVAL_CHUNK].to(dev)
            ce_sum += F.cross_entropy(logits, yc, reduction="sum").item()
            correct += int((logits.argmax(dim=1) == yc).sum())
    n_test = xte.shape[0]
    sps = args.steps / train_s
    emit(metric="cnn_train", **lead, steps=args.steps, train_s=round(train_s, 3),
         steps_per_s=round(sps, 2), ms_per_step=round(1e3 / sps, 4),
         examples_per_s=round(sps * args.batch_size, 1),
         train_loss_last100=round(sum(tail) / len(tail), 4),
         test_accuracy=round(correct / n_test, 4), test_cross_entropy=round(ce_sum / n_test, 4),
         final_lr=opt.param_groups[0]["lr"], data_load_s=round(load_s, 2), seed=args.seed,
         **tail_kv)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
