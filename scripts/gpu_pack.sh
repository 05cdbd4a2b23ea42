#!/usr/bin/env bash
# Bundles what the GPU checks need into .gpu-bundle/ (ignored by git), for a machine that has an
# NVIDIA GPU with its driver and the CUDA libraries (cudart, cuBLAS, NCCL: the system's or
# those of the nvidia-* Python wheels) but none of our other dependencies: a Release build
# without OpenBLAS and oneDNN (the CPU reference kernels then use their own GEMM, and the
# bundle stays small), the stripped GPU test and bench binaries, their non-CUDA shared
# libraries, the Fashion-MNIST files and the fortunes text (gpt_replica's). Device code is
# built for sm_90 (H100, H200) only, which keeps the bundle small; DG_CUDA_ARCH=80 (or "80;90")
# for other GPUs. On the GPU machine, from the repository
# root: scripts/gpu_check.sh OUT.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=$root/build-gpu-pack
out=$root/.gpu-bundle
data=${DG_MNIST_DIR:-/usr/share/datasets/fashion-mnist}
fortunes=${DG_FORTUNES_DIR:-/usr/share/games/fortunes}
bins=(test_cuda_device test_gpu_placement test_gpu_kernels gpu_bench mlp_local mirrored mnist_replica cnn_replica gpt_replica dg-launch
    step_bench)

cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release -DDG_WITH_BLAS=OFF -DDG_WITH_DNNL=OFF -DCMAKE_CUDA_ARCHITECTURES=${DG_CUDA_ARCH:-90} >"$root/.gpu_pack_configure.log"
grep -q "distgraph: CUDA device ON" "$root/.gpu_pack_configure.log" ||
    { echo "gpu_pack: the CUDA toolkit was not found: the bundle would hold no GPU code" >&2; exit 1; }
rm -f "$root/.gpu_pack_configure.log"
cmake --build "$build" -j"$(nproc)" --target "${bins[@]}"

rm -rf "$out"
mkdir -p "$out/bin" "$out/lib" "$out/data" "$out/fortunes"
for b in "${bins[@]}"; do
    f=$(find "$build" -type f -name "$b" -perm -u+x | head -1)
    [ -n "$f" ] || { echo "gpu_pack: $b was not built" >&2; exit 1; }
    cp "$f" "$out/bin/"
    strip "$out/bin/$b"
done
# Shared libraries other than the C runtime and CUDA's own (found on the GPU machine).
skip='^(linux-vdso|ld-linux|libc\.|libm\.|libdl\.|librt\.|libpthread\.|libstdc\+\+|libgcc_s|libcuda|libcudart|libcublas|libnccl|libnvidia)'
for b in "${bins[@]}"; do ldd "$out/bin/$b"; done | awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}' |
    sort -u | while read -r name path; do
        echo "$name" | grep -Eq "$skip" || cp -L "$path" "$out/lib/$name"
    done
# One xz archive of the binaries and libraries: they share most of their code, which xz's
# window finds across files (70 MB to under 10); gpu_check.sh unpacks it.
tar -C "$out" -cf - bin lib | xz -9 -T1 >"$out/bin.tar.xz"
rm -rf "$out/bin" "$out/lib"
cp "$data"/*-ubyte.gz "$out/data/"
# gpt_replica's text: the fortune files whose names have no dot.
find "$fortunes" -maxdepth 1 -type f ! -name '*.*' -exec cp {} "$out/fortunes/" \;
[ -n "$(ls "$out/fortunes")" ] || { echo "gpu_pack: no fortune files in $fortunes (Debian's fortunes package)" >&2; exit 1; }
cp "$root/bench/peers/torch_mlp_cuda.py" "$root/bench/peers/torch_cnn.py" "$root/bench/peers/fmnist_data.py" \
    "$root/bench/peers/torch_gpt.py" "$root/bench/peers/torch_attention_cuda.py" "$out/"
du -sh "$out"
