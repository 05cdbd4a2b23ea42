#!/usr/bin/env bash
# Sets up, builds and runs the demo: the MNIST-replica model trained on Fashion-MNIST.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh
build/bin/mlp_local --train_steps "${TRAIN_STEPS:-2000}"
