#!/usr/bin/env bash
# Runs the GPU checks from the bundle that scripts/gpu_pack.sh made (.gpu-bundle/), on a machine
# with an NVIDIA GPU, and writes at most 8 files into the folder given (default gpu-results):
#   gpu.txt              the GPU, its driver, the date
#   tests.log            test_cuda_device, test_gpu_placement, test_gpu_kernels (poisoned
#                        outputs, every kernel against the CPU)
#   sanitizer.log        the same GPU tests under compute-sanitizer memcheck
#   mlp.log              mlp_local --device /gpu:0 against /cpu:0 (default flags, 2000 steps),
#                        then the mirrored example on the GPU
#   gpu_bench.jsonl      MatMul through the executor vs raw cuBLAS; the MLP step at batch
#                        100, 1,000, 10,000
#   torch_mlp.jsonl      the same MLP steps in PyTorch CUDA (bench/peers/torch_mlp_cuda.py)
#   summary.txt          one line per check with its exit status
# CUDA libraries come from the system or, failing that, from the nvidia-* Python wheels of
# the python3 on the PATH.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
c=$root/.gpu-bundle
out=${1:-$root/gpu-results}
mkdir -p "$out"
[ -x "$c/bin/test_gpu_kernels" ] || { echo "gpu_check: no bundle in $c (run scripts/gpu_pack.sh first)" >&2; exit 2; }
wheels=$(python3 - 2>/dev/null <<'PY'
import glob, os
try:
    import nvidia
    dirs = {os.path.dirname(p) for r in nvidia.__path__ for p in glob.glob(os.path.join(r, "*", "lib", "lib*.so*"))}
    print(":".join(sorted(dirs)))
except Exception:
    pass
PY
)
export LD_LIBRARY_PATH="$c/lib${wheels:+:$wheels}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
summary=$out/summary.txt
: >"$summary"
step() {   # step NAME LOG CMD...: runs CMD appending to LOG, records its exit status
    local name=$1 log=$2
    shift 2
    echo "== $name: $*" >>"$log"
    "$@" >>"$log" 2>&1
    local rc=$?
    echo "$name rc=$rc" | tee -a "$summary"
}
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader; date -u; } >"$out/gpu.txt" 2>&1
cat "$out/gpu.txt"
for t in test_cuda_device test_gpu_placement test_gpu_kernels; do
    step "$t" "$out/tests.log" "$c/bin/$t"
done
if command -v compute-sanitizer >/dev/null; then
    for t in test_cuda_device test_gpu_kernels; do
        step "memcheck $t" "$out/sanitizer.log" compute-sanitizer --tool memcheck --leak-check full \
            --error-exitcode 99 "$c/bin/$t"
    done
else
    echo "memcheck: no compute-sanitizer on the PATH" | tee -a "$summary"
fi
step "mlp_local /gpu:0" "$out/mlp.log" "$c/bin/mlp_local" --data_dir "$c/data" --device /gpu:0
step "mlp_local /cpu:0" "$out/mlp.log" "$c/bin/mlp_local" --data_dir "$c/data" --device /cpu:0
grep -h "^test accuracy" "$out/mlp.log" | tee -a "$summary"
step "mirrored GPU" "$out/mlp.log" "$c/bin/mirrored" --data_dir "$c/data" --device_type GPU --num_devices 1
step "gpu_bench" "$out/gpu_bench.jsonl" "$c/bin/gpu_bench"
step "torch_mlp_cuda" "$out/torch_mlp.jsonl" python3 "$c/torch_mlp_cuda.py"
