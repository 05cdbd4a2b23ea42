#!/usr/bin/env bash
# Builds the Debian package of distgraph from this tree: build-deb/distgraph_<version>_<arch>.deb
# (CPack; dependencies from dpkg-shlibdeps plus the development packages the headers and the
# static library build against). The package is a CPU build: the CUDA toolkit's libraries are
# not Debian packages a clean machine can pull, so a GPU build is for `cmake --install`.
# Then checks it (scripts/check_deb.sh): its files, its dependencies, and that every library
# its binaries load comes from a package it depends on.
#   scripts/package.sh                  build and check
#   scripts/package.sh --install-test   also install it with apt in a clean Debian chroot
#                                       (debootstrap; needs root and the Debian mirror) and
#                                       build and run examples/out_of_tree there
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
out=build-deb
cmake -S . -B "$out" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_INSTALL_PREFIX=/usr -DDG_WITH_CUDA=OFF \
    -DDG_BUILD_TESTS=OFF -DDG_BUILD_EXAMPLES=OFF > "$out.log" 2>&1 || { cat "$out.log"; exit 1; }
cmake --build "$out" -j"$(nproc)" >> "$out.log" 2>&1 || { tail -30 "$out.log"; exit 1; }
(cd "$out" && cpack -G DEB) >> "$out.log" 2>&1 || { tail -30 "$out.log"; exit 1; }
deb=$(ls "$out"/distgraph_*.deb | head -1)
echo "package: $deb"
scripts/check_deb.sh "$deb"
if [ "${1:-}" = --install-test ]; then
    scripts/check_deb.sh --install-test "$deb"
fi
