#!/usr/bin/env bash
# Sets up, builds and runs every test: unit, integration and smoke tests through CTest, then
# the unit tests again under valgrind memcheck, as many at once as there are cores (set
# DG_SKIP_VALGRIND=1 to skip that pass), then the mutation checks of tests/mutation (the code
# broken on purpose in a scratch copy: each mutant must make a test fail; DG_SKIP_MUTANTS=1
# skips them), then
# every fuzz target of tests/fuzz for DG_FUZZ_SECONDS each (default 60; DG_SKIP_FUZZ=1 skips
# them), built with clang in build-fuzz/.
set -euo pipefail
cd "$(dirname "$0")/.."
start=$SECONDS
took() { echo "== $1 took $((SECONDS - t0)) s ($((SECONDS - start)) s since the start)"; t0=$SECONDS; }
t0=$SECONDS
scripts/setup.sh
took "setup"
scripts/build.sh
took "build"
cd build
ctest --output-on-failure -j"$(nproc)" --timeout 600
took "ctest"
if [ "${DG_SKIP_VALGRIND:-0}" != 1 ]; then
    echo "== unit tests under valgrind memcheck, $(nproc) at a time"
    # As CTest gives them: the source tree (data files: tests/tf_conformance/ tables).
    DG_SOURCE_DIR=$(cd .. && pwd)
    export DG_SOURCE_DIR
    # OpenBLAS for float32 GEMM too: memcheck reports oneDNN's JIT kernels reading whole vectors
    # past the end of their own buffers (by design) and runs them slowly (executor/cpu/gemm.c).
    export DG_GEMM=openblas
    # No tensor buffer cache: every buffer comes fresh from malloc, so memcheck still reports a
    # kernel reading what nothing wrote (a reused buffer holds an earlier tensor's bytes).
    export DG_TENSOR_CACHE_MB=0
    vg_one() {   # vg_one TEST: runs it under memcheck, its exit status into TEST.valgrind.rc
        valgrind -q --suppressions=../tests/valgrind.supp --leak-check=full \
            --errors-for-leak-kinds=definite,indirect \
            --error-exitcode=99 "$1" >"$1.valgrind.log" 2>&1
        echo $? >"$1.valgrind.rc"
    }
    export -f vg_one
    for t in tests/test_*; do
        if [ -x "$t" ] && [ "${t%.*}" = "$t" ]; then echo "$t"; fi
    done | xargs -P "$(nproc)" -I{} bash -c 'vg_one {}'
    pass=0
    fail=0
    skip=0
    for t in tests/test_*; do
        if [ ! -x "$t" ] || [ "${t%.*}" != "$t" ]; then continue; fi
        rc=$(cat "$t.valgrind.rc" 2>/dev/null || echo 98)
        case $rc in
            0) pass=$((pass + 1)) ;;
            77) skip=$((skip + 1)) ;;
            *) fail=$((fail + 1)); echo "valgrind: $t failed (exit $rc):"; tail -40 "$t.valgrind.log" ;;
        esac
    done
    echo "valgrind: $pass passed, $fail failed, $skip skipped"
    [ "$fail" -eq 0 ]
    # The mutation checks below run the tests as CTest does: oneDNN, the cache.
    unset DG_GEMM DG_TENSOR_CACHE_MB
    took "valgrind"
fi
if [ "${DG_SKIP_MUTANTS:-0}" != 1 ]; then
    echo "== mutation checks (tests/mutation/mutate.py)"
    python3 ../tests/mutation/mutate.py
    took "mutation checks"
fi
if [ "${DG_SKIP_FUZZ:-0}" != 1 ]; then
    echo "== fuzz targets, ${DG_FUZZ_SECONDS:-60} s each (tests/fuzz/README.md)"
    ../tests/fuzz/run_fuzz.sh all "${DG_FUZZ_SECONDS:-60}"
    took "fuzz targets"
fi
