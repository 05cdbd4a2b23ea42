#!/usr/bin/env bash
# Runs bench/allreduce_bench (distgraph) and bench/peers/torch_allreduce.py (torch.distributed,
# gloo) back to back, prints every JSON line of both, a table of bus bandwidth per size, and
# for each process count the ratio ours/gloo at 64 MiB (the bar: >= 1).
#   bench/allreduce_compare.sh                    # 2 and 4 processes, 4 KiB .. 256 MiB
#   NPROCS=2 MAX_BYTES=67108864 bench/allreduce_compare.sh
# distgraph runs as shipped: its server raises glibc's mmap and trim thresholds itself
# (dg_set_malloc_tuning), since received pieces are fresh buffers that
# glibc would otherwise hand back to the kernel and fault in again. gloo gets the same
# setting through GLIBC_TUNABLES (ALLOC_TUNABLES; set it empty for glibc's defaults), which
# helps it too (see docs/COLLECTIVES.md). Needs build/bin/allreduce_bench (BUILD_DIR) and /usr/bin/python3 with torch.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}
NPROCS=${NPROCS:-2,4}
MIN_BYTES=${MIN_BYTES:-4096}
MAX_BYTES=${MAX_BYTES:-268435456}
SCALE=${SCALE:-1}
ALLOC_TUNABLES=${ALLOC_TUNABLES-glibc.malloc.trim_threshold=1073741824:glibc.malloc.mmap_threshold=33554432}
PY=${PYTHON:-/usr/bin/python3}
out=$(mktemp)
trap 'rm -f "$out"' EXIT
"$BUILD_DIR/bin/allreduce_bench" --nprocs "$NPROCS" \
    --min_bytes "$MIN_BYTES" --max_bytes "$MAX_BYTES" --scale "$SCALE" | tee -a "$out"
env ${ALLOC_TUNABLES:+GLIBC_TUNABLES=$ALLOC_TUNABLES} "$PY" bench/peers/torch_allreduce.py --nprocs "$NPROCS" \
    --min_bytes "$MIN_BYTES" --max_bytes "$MAX_BYTES" --scale "$SCALE" | tee -a "$out"
"$PY" - "$out" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
by = {}
for r in rows:
    by[(r["nprocs"], r["bytes"], r["impl"])] = r
print(f'{"nprocs":>6} {"bytes":>10} {"distgraph GB/s":>15} {"gloo GB/s":>10} {"ratio":>6}')
for (n, b, impl) in sorted(k for k in by if k[2] == "distgraph"):
    o, g = by[(n, b, "distgraph")], by.get((n, b, "gloo"))
    gb = g["busbw_GBps"] if g else float("nan")
    print(f'{n:>6} {b:>10} {o["busbw_GBps"]:>15.3f} {gb:>10.3f} {o["busbw_GBps"] / gb if g and gb else float("nan"):>6.2f}')
for n in sorted({k[0] for k in by}):
    o, g = by.get((n, 64 << 20, "distgraph")), by.get((n, 64 << 20, "gloo"))
    if o and g:
        print(json.dumps({"bench": "allreduce", "metric": "busbw_ratio_vs_gloo_64MiB", "nprocs": n,
                          "value": round(o["busbw_GBps"] / g["busbw_GBps"], 3), "unit": "x"}))
PY
