#!/usr/bin/env bash
# Chaos runs of mnist_replica in every fault-tolerant mode (async ps, sync replicas, elastic
# all-reduce, and all-reduce growing from 2 workers to 4 and back): JSON lines, one per run.
# bench/elastic_chaos.py says what is measured; docs/ELASTIC.md has the figures.
#   bench/elastic_chaos.sh [async] [sync] [allreduce] [grow]     (STEPS, RUNS, SEED in the environment)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
export DG_BIN_DIR=${DG_BIN_DIR:-$here/../build/bin}
exec python3 "$here/elastic_chaos.py" "$@"
