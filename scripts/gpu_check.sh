#!/usr/bin/env bash
# Runs the GPU checks from the bundle that scripts/gpu_pack.sh made (.gpu-bundle/), on a machine
# with an NVIDIA GPU, and writes at most 8 files into the folder given (default gpu-results):
#   gpu.txt              the GPU, its driver, the date
#   tests.log            test_cuda_device, test_gpu_placement, test_gpu_kernels (poisoned
#                        outputs, every kernel against the CPU)
#   sanitizer.log        the same GPU tests under compute-sanitizer memcheck
#   mlp.log              mlp_local --device /gpu:0 against /cpu:0 (default flags, 2000 steps),
#                        the mirrored example on the GPU, then mnist_replica clusters (async
#                        ps, sync replicas, all-reduce) whose workers compute on GPU 0
#   gpu_bench.jsonl      MatMul through the executor vs raw cuBLAS; the MLP step at batch
#                        100, 1,000, 10,000
#   torch_mlp.jsonl      the same MLP steps in PyTorch CUDA (bench/peers/torch_mlp_cuda.py),
#                        and the CNN step (bench/peers/torch_cnn.py --device cuda)
#   summary.txt          one line per check with its exit status
# CUDA libraries come from the system or, failing that, from the nvidia-* Python wheels of
# the python3 on the PATH.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
c=$root/.gpu-bundle
out=${1:-$root/gpu-results}
mkdir -p "$out"
[ -f "$c/bin/test_gpu_kernels.gz" ] || { echo "gpu_check: no bundle in $c (run scripts/gpu_pack.sh first)" >&2; exit 2; }
bin=$(mktemp -d "${TMPDIR:-/tmp}/dg-gpu-bin.XXXXXX")
trap 'rm -rf "$bin"' EXIT
for f in "$c"/bin/*.gz; do
    gzip -dc "$f" >"$bin/$(basename "$f" .gz)" && chmod +x "$bin/$(basename "$f" .gz)"
done
wheels=$(python3 - 2>/dev/null <<'PY'
import glob, os
try:
    import nvidia
    dirs = {os.path.dirname(p) for r in nvidia.__path__
            for p in glob.glob(os.path.join(r, "**", "lib*.so*"), recursive=True)}
    print(":".join(sorted(dirs)))
except Exception:
    pass
PY
)
toolkit=
for d in /usr/local/cuda/lib64 /usr/local/cuda/lib; do [ -d "$d" ] && toolkit=${toolkit:+$toolkit:}$d; done
export LD_LIBRARY_PATH="$c/lib${toolkit:+:$toolkit}${wheels:+:$wheels}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
summary=$out/summary.txt
: >"$summary"
limit=${DG_GPU_STEP_TIMEOUT:-240}
step() {   # step NAME LOG CMD...: runs CMD (at most $limit s) appending to LOG, records its exit status
    local name=$1 log=$2
    shift 2
    echo "== $name: $*" >>"$log"
    local t0=$SECONDS
    timeout "$limit" "$@" >>"$log" 2>&1
    local rc=$?
    echo "$name rc=$rc ($((SECONDS - t0)) s)" | tee -a "$summary"
}
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader; date -u; } >"$out/gpu.txt" 2>&1
cat "$out/gpu.txt"
for t in test_cuda_device test_gpu_placement test_gpu_kernels; do
    step "$t" "$out/tests.log" "$bin/$t"
done
if command -v compute-sanitizer >/dev/null; then
    for t in test_cuda_device test_gpu_kernels; do
        step "memcheck $t" "$out/sanitizer.log" compute-sanitizer --tool memcheck --leak-check full --report-api-errors no \
            --error-exitcode 99 "$bin/$t"
    done
else
    echo "memcheck: no compute-sanitizer on the PATH" | tee -a "$summary"
fi
step "mlp_local /gpu:0" "$out/mlp.log" "$bin/mlp_local" --data_dir "$c/data" --device /gpu:0
step "mlp_local /cpu:0" "$out/mlp.log" "$bin/mlp_local" --data_dir "$c/data" --device /cpu:0
grep -h "^test accuracy" "$out/mlp.log" | tee -a "$summary"
step "mirrored GPU" "$out/mlp.log" "$bin/mirrored" --data_dir "$c/data" --device_type GPU --num_devices 1
# Clusters of processes on this machine (ps on the CPU, the workers' compute on GPU 0), with
# nvidia-smi listing the processes that hold GPU memory meanwhile: the workers must be there.
replica() {   # replica NAME DG-LAUNCH-ARGS... -- MNIST_REPLICA-ARGS...
    local name=$1
    shift
    local apps=$out/.apps
    nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv,noheader -lms 200 \
        >"$apps" 2>/dev/null &
    local smi=$!
    step "$name" "$out/mlp.log" "$bin/dg-launch" --timeout 200 "$@" --data_dir "$c/data" \
        --num_gpus 1 ${REPLICA_STEPS:+--train_steps $REPLICA_STEPS}
    kill "$smi" 2>/dev/null
    wait "$smi" 2>/dev/null
    echo "$name: $(grep -c _replica "$apps") samples of the program on the GPU," \
        "$(grep _replica "$apps" | cut -d, -f1 | sort -u | wc -l) processes" | tee -a "$summary"
    rm -f "$apps"
}
REPLICA_STEPS=2000
replica "mnist_replica async ps" --ps 1 --workers 2 -- "$bin/mnist_replica"
replica "mnist_replica sync" --ps 1 --workers 2 -- "$bin/mnist_replica" --sync_replicas
replica "mnist_replica all_reduce" --workers 2 -- "$bin/mnist_replica" --all_reduce
REPLICA_STEPS=
replica "cnn_replica async ps" --ps 1 --workers 2 -- "$bin/cnn_replica"
grep -h "validation accuracy" "$out/mlp.log" | tee -a "$summary"
# The CNN training step (batch 100) on the GPU.
step "cnn step_bench GPU" "$out/gpu_bench.jsonl" "$bin/step_bench" --model cnn --device /gpu:0 --steps 200 --warmup 20 \
    --data_dir "$c/data"
step "torch_cnn cuda" "$out/torch_mlp.jsonl" env FMNIST_DIR="$c/data" python3 "$c/torch_cnn.py" --step-bench --device cuda
step "gpu_bench" "$out/gpu_bench.jsonl" "$bin/gpu_bench"
step "torch_mlp_cuda" "$out/torch_mlp.jsonl" python3 "$c/torch_mlp_cuda.py"
