#!/usr/bin/env bash
# What a user does with distgraph outside its tree: `cmake --install` into a temporary prefix,
# then examples/out_of_tree (a copy, elsewhere) built three ways, each of which must run and
# see its loss fall tenfold:
#   CMake find_package(distgraph) -> distgraph::distgraph (the shared library),
#   pkg-config (the shared library),
#   CMake with COMPONENTS static -> distgraph::distgraph_static (libdistgraph.a).
# The two shared builds must load the installed libdistgraph.so.<SOVERSION>, the static one
# no libdistgraph at all; the installed tools and headers must be there and work.
set -euo pipefail
src="${DG_SOURCE_DIR:?}"
build="${DG_BIN_DIR:?}/.."
fail() { echo "FAIL: $*"; exit 1; }
command -v pkg-config > /dev/null || fail "pkg-config is missing (scripts/setup.sh installs pkgconf)"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
prefix="$tmp/prefix"
cmake --install "$build" --prefix "$prefix" > "$tmp/install.log" || { cat "$tmp/install.log"; fail "cmake --install"; }
libdir=$(find "$prefix" -name 'libdistgraph.so.*.*' -printf '%h\n' | head -1)
[ -n "$libdir" ] || fail "no libdistgraph.so installed: $(cat "$tmp/install.log")"
so=$(sed -n 's/^#define DG_SOVERSION \([0-9]*\)/\1/p' "$src/include/distgraph/version.h")
for f in include/distgraph/distgraph.h include/distgraph/version.h bin/dg-server bin/dg-launch bin/dg-inspect; do
    [ -e "$prefix/$f" ] || fail "$f not installed"
done
for f in "libdistgraph.so.$so" libdistgraph.so libdistgraph.a pkgconfig/distgraph.pc cmake/distgraph/distgraphConfig.cmake \
         cmake/distgraph/distgraphConfigVersion.cmake; do
    [ -e "$libdir/$f" ] || fail "$libdir/$f not installed"
done
"$prefix/bin/dg-server" --help > /dev/null || fail "the installed dg-server does not run"
echo "installed into $prefix ($(find "$prefix" -type f | wc -l) files)"

# run NAME BINARY [--shared|--static]: runs it on free ports; checks what it loads.
run() {
    local name=$1 bin=$2 kind=$3 out
    if [ "$kind" = shared ]; then
        # Whole outputs first: grep -q leaving early would end the writer with SIGPIPE, which
        # pipefail reports as a failure.
        local dyn libs
        dyn=$(readelf -d "$bin")
        libs=$(LD_LIBRARY_PATH="$libdir" ldd "$bin")
        grep -q "NEEDED.*\[libdistgraph.so.$so\]" <<<"$dyn" || fail "$name: does not need libdistgraph.so.$so"
        grep -q "libdistgraph.so.$so => $libdir/" <<<"$libs" ||
            fail "$name: does not load the installed library: $(LD_LIBRARY_PATH="$libdir" ldd "$bin")"
    else
        grep -q "libdistgraph" <<<"$(readelf -d "$bin")" && fail "$name: the static build needs a libdistgraph.so"
    fi
    out=$(LD_LIBRARY_PATH="$libdir" timeout 120 "$bin" --steps 200) || { echo "$out"; fail "$name: train_linear failed"; }
    echo "$name: $out" | tr '\n' ' '
    echo
    # The fall in the loss from the numbers it prints, not from its verdict line.
    local first last
    first=$(sed -n 's/^loss at step 1: \([^,]*\), at step [0-9]*: .*$/\1/p' <<<"$out")
    last=$(sed -n 's/^loss at step 1: [^,]*, at step [0-9]*: \(.*\)$/\1/p' <<<"$out")
    [[ "$first" =~ ^[0-9]+\.[0-9]+$ && "$last" =~ ^[0-9]+\.[0-9]+$ ]] ||
        fail "$name: the losses \"$first\" and \"$last\" are not finite numbers"
    awk -v f="$first" -v l="$last" 'BEGIN { exit !(l + 0 < (f + 0) / 10) }' ||
        fail "$name: the loss fell from $first to $last, less than tenfold"
    grep -q "^distgraph $(sed -n 's/^#define DG_VERSION_STRING "\(.*\)"/\1/p' "$src/include/distgraph/version.h") " <<<"$out" ||
        fail "$name: dg_version() does not say the header's version"
}

cp -r "$src/examples/out_of_tree" "$tmp/proj"
cmake -S "$tmp/proj" -B "$tmp/cmake_shared" -DCMAKE_PREFIX_PATH="$prefix" > "$tmp/c1.log" 2>&1 &&
    cmake --build "$tmp/cmake_shared" >> "$tmp/c1.log" 2>&1 || { cat "$tmp/c1.log"; fail "find_package build"; }
run "cmake, shared" "$tmp/cmake_shared/train_linear" shared

PKG_CONFIG_PATH="$libdir/pkgconfig" make -C "$tmp/proj" > "$tmp/m.log" 2>&1 || { cat "$tmp/m.log"; fail "pkg-config build"; }
run "pkg-config, shared" "$tmp/proj/train_linear" shared

cmake -S "$tmp/proj" -B "$tmp/cmake_static" -DCMAKE_PREFIX_PATH="$prefix" -DDISTGRAPH_STATIC=ON > "$tmp/c2.log" 2>&1 &&
    cmake --build "$tmp/cmake_static" >> "$tmp/c2.log" 2>&1 || { cat "$tmp/c2.log"; fail "static find_package build"; }
run "cmake, static" "$tmp/cmake_static/train_linear" static
