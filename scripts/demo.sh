#!/usr/bin/env bash
# Sets up, builds and runs the demo: a local cluster (1 parameter server, 2 workers, real
# processes on 127.0.0.1) training the MNIST-replica model on Fashion-MNIST asynchronously.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh
build/bin/dg-launch --ps 1 --workers 2 -- build/bin/mnist_replica --train_steps "${TRAIN_STEPS:-2000}" \
    --log_every 250 --quiet
