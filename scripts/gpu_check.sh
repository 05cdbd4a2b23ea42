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
#   gpu_bench.jsonl      MatMul through the executor vs raw cuBLAS (float32, then bfloat16 and
#                        float16 against cublasGemmEx); the MLP step at batch 100, 1,000,
#                        10,000; the fused causal attention at T = 256 and 1024
#   torch_mlp.jsonl      the same MLP steps in PyTorch CUDA (bench/peers/torch_mlp_cuda.py),
#                        the CNN step (bench/peers/torch_cnn.py --device cuda) and the
#                        attention (bench/peers/torch_attention_cuda.py)
#   gpt.log              gpt_replica's GPU configuration (6 layers, width 384, context 256,
#                        batch 64, dropout 0.2) on GPU 0, float32, TF32 and bf16 products, against
#                        PyTorch's step (bench/peers/torch_gpt.py --device cuda, with
#                        F.scaled_dot_product_attention); a JSON line per system and precision
#   summary.txt          one line per check with its exit status
# CUDA libraries come from the system or, failing that, from the nvidia-* Python wheels of
# the python3 on the PATH.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
c=$root/.gpu-bundle
out=${1:-$root/gpu-results}
mkdir -p "$out"
[ -f "$c/bin.tar.xz" ] || { echo "gpu_check: no bundle in $c (run scripts/gpu_pack.sh first)" >&2; exit 2; }
unpacked=$(mktemp -d "${TMPDIR:-/tmp}/dg-gpu-bin.XXXXXX")
trap 'rm -rf "$unpacked"' EXIT
# xz if the machine has it, else Python's tarfile (lzma).
if command -v xz >/dev/null; then
    xz -dc "$c/bin.tar.xz" | tar -C "$unpacked" -xf -
else
    python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])' "$c/bin.tar.xz" "$unpacked"
fi || { echo "gpu_check: could not unpack $c/bin.tar.xz" >&2; exit 2; }
bin=$unpacked/bin
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
export LD_LIBRARY_PATH="$unpacked/lib${toolkit:+:$toolkit}${wheels:+:$wheels}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
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
step "gpu_bench bfloat16" "$out/gpu_bench.jsonl" "$bin/gpu_bench" --dtype bfloat16 --sizes 1024,4096,8192 --no_mlp \
    --no_attention
step "gpu_bench float16" "$out/gpu_bench.jsonl" "$bin/gpu_bench" --dtype float16 --sizes 4096 --no_mlp --no_attention
step "torch_attention_cuda" "$out/torch_mlp.jsonl" python3 "$c/torch_attention_cuda.py"
# The GPT's GPU configuration: ms per step from two runs of gpt_replica (SHORT and LONG steps;
# the difference leaves out the start, the graph's compile and the validation at the end),
# then PyTorch's over LONG - SHORT steps after its warm-up: float32, TF32, and bfloat16 products
# (gpt_replica --mixed_precision bf16; PyTorch's autocast).
gpt_args=(--gpu_config --batch_size 64 --num_gpus 1 --log_every 1000000 --quiet --eval_windows 64
    --data_dir "$c/fortunes")
short=${GPT_SHORT:-20} long=${GPT_LONG:-120}
[ "$long" -gt "$short" ] || { echo "gpu_check: GPT_LONG ($long) must be more than GPT_SHORT ($short)" >&2; exit 2; }
touch "$out/gpt.log"
port=$((20000 + RANDOM % 20000))
for mode in float32 tf32 bf16; do
    flag=() tflag=()
    case $mode in
    tf32) flag=(--gpu_allow_tf32) tflag=(--tf32) ;;
    bf16) flag=(--mixed_precision bf16) tflag=(--autocast bf16) ;;
    esac
    secs=()
    for n in "$short" "$long"; do
        before=$(wc -l <"$out/gpt.log")
        step "gpt_replica GPU $n steps $mode" "$out/gpt.log" "$bin/gpt_replica" --worker_hosts "127.0.0.1:$port" \
            --job_name worker --task_index 0 --train_steps "$n" "${gpt_args[@]}" ${flag[@]+"${flag[@]}"}
        port=$((port + 1))
        # this run's lines only: a run that failed leaves none
        secs+=("$(tail -n +$((before + 1)) "$out/gpt.log" | sed -n 's/^Training elapsed time: \([0-9.]*\) s.*/\1/p')")
    done
    awk -v a="${secs[0]}" -v b="${secs[1]}" -v n=$((long - short)) -v t="$mode" 'BEGIN {
        if (a == "" || b == "") { print "{\"bench\": \"gpt_gpu\", \"system\": \"distgraph\", \"error\": \"no elapsed time\"}"; exit }
        ms = (b - a) * 1000 / n
        printf "{\"bench\": \"gpt_gpu\", \"system\": \"distgraph\", \"mode\": \"%s\", \"ms_per_step\": %.3f, \"tokens_per_s\": %.0f}\n", t, ms, 64 * 256 * 1000 / ms
    }' | tee -a "$out/gpt.log" "$summary"
    before=$(wc -l <"$out/gpt.log")
    step "torch_gpt cuda $mode" "$out/gpt.log" python3 "$c/torch_gpt.py" --device cuda --data_dir "$c/fortunes" \
        --step-bench --steps $((long - short)) --batch 64 --block 256 --n_layer 6 --n_head 6 --n_embd 384 \
        --dropout 0.2 --sdpa --fused_adamw ${tflag[@]+"${tflag[@]}"}
    tail -n +$((before + 1)) "$out/gpt.log" | grep '"torch_gpt"' | tail -1 | tee -a "$summary"
done
