#!/usr/bin/env bash
# A ps (standing dg-server) under a worker SIGKILLed mid-step and restarted 5 times while the
# chief trains: the ps aborts the dead worker's steps, frees its graphs once its master is gone
# (orphan timeout), unmaps its shared memory, and ends where it started in private memory
# (within 5% or 1 MiB), descriptors and /dev/shm. bench/churn_soak.sh does the work; CYCLES=50 there is the soak.
source "$(dirname "$0")/common.bash"
out=$(CYCLES=5 DG_BIN_DIR="$BIN" bash "$DG_SOURCE_DIR/bench/churn_soak.sh" 2>&1) || { echo "$out"; fail "churn soak"; }
echo "$out"
grep -q '"metric": "graphs_freed_after_their_master_left"' <<<"$out" || fail "no figures"
echo "PASS"
