#!/usr/bin/env bash
# Configures and builds into build/ (binaries in build/bin, tests in build/tests).
# The CUDA device is built when nvcc is found (PATH or /usr/local/cuda/bin); no GPU is needed.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v nvcc >/dev/null 2>&1 && [ -x /usr/local/cuda/bin/nvcc ]; then
    export PATH="$PATH:/usr/local/cuda/bin"
fi
cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo ${DG_CMAKE_ARGS:-} >/dev/null
cmake --build build -j"$(nproc)"
