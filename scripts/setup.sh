#!/usr/bin/env bash
# Installs the Debian packages distgraph needs, and nothing when they are all there.
# Run as root (or with sudo available) on Debian/Ubuntu.
set -euo pipefail

# clang, its sanitizer and libFuzzer runtimes (libclang-rt-dev: only recommended by clang, so
# not installed without it here) and llvm (llvm-symbolizer, for readable reports) build and
# run the fuzz targets of tests/fuzz. protobuf-c writes TensorBoard's event files;
# python3-venv holds the tensorboard package the event-file test reads them back with. cairo
# draws dg-inspect's PNG charts (with the fonts fontconfig finds: fonts-dejavu-core). gdb: an
# integration test that finds a process hanging prints its threads' stacks. libdnnl-dev (oneDNN)
# runs float32 GEMM with the widest vectors the CPU has (executor/cpu/gemm.c); qemu-user runs
# the kernels' tests as on a CPU without AVX-512 (tests/smoke/narrow_cpu_qemu.sh). fortunes: the
# text gpt_replica trains on (/usr/share/games/fortunes). libmetis-dev: METIS partitions graphs
# for the automatic placer (placer/metis_place.c).
PKGS=(build-essential cmake pkg-config libzmq3-dev libmsgpack-dev libsqlite3-dev
      libopenblas-dev zlib1g-dev libcmocka-dev dataset-fashion-mnist valgrind python3 iperf3
      clang libclang-rt-dev llvm protobuf-c-compiler libprotobuf-c-dev python3-venv
      libcairo2-dev fonts-dejavu-core gdb libdnnl-dev
      qemu-user fortunes libmetis-dev)

missing=()
for p in "${PKGS[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
    exit 0
fi
echo "setup: installing ${missing[*]}"
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
