#!/usr/bin/env bash
# The kernels on a CPU without AVX-512: the GEMM's test and the tests that run the most
# products and convolutions again under qemu-x86_64 -cpu Haswell (AVX2 and FMA, nothing wider),
# which answers CPUID as that CPU would. oneDNN must pick its AVX2 kernels there, the direct
# convolutions' clones their AVX2 ones (the loader resolves them from CPUID), and every test
# must pass. Skipped (77) without qemu-x86_64 (Debian's qemu-user, from scripts/setup.sh).
set -euo pipefail
fail() { echo "FAIL: $*"; exit 1; }
command -v qemu-x86_64 >/dev/null || { echo "SKIP: no qemu-x86_64 (apt-get install qemu-user)"; exit 77; }
tests="${DG_BIN_DIR:?}/../tests"
out=$(qemu-x86_64 -cpu Haswell "$tests/test_cpu_gemm" 2>&1) || { echo "$out"; fail "test_cpu_gemm under a Haswell CPU"; }
line=$(grep -m1 '^CPU ' <<<"$out" || true)
echo "$line"
[ -n "$line" ] || { echo "$out"; fail "test_cpu_gemm printed no CPU line"; }
grep -q ': avx2; cap avx2;' <<<"$line" || fail "the CPU seen under qemu is not an AVX2 one"
if grep -q 'oneDNN' <<<"$line"; then
    grep -q 'float32 GEMM oneDNN [0-9.]* avx2 (avx2)' <<<"$line" || fail "oneDNN did not pick its AVX2 kernels"
fi
for t in test_conv_direct test_gradients test_fusion test_training_basics; do
    [ -x "$tests/$t" ] || fail "no $tests/$t"
    o=$(qemu-x86_64 -cpu Haswell "$tests/$t" 2>&1) || { echo "$o" | tail -30; fail "$t under a Haswell CPU"; }
    echo "$t: $(grep -E '^\[  PASSED  \]' <<<"$o")"
done
echo "PASS narrow_cpu_qemu"
