#!/usr/bin/env bash
# Checks a distgraph Debian package (scripts/package.sh builds it):
#   scripts/check_deb.sh PKG.deb                 its control fields, files and dependencies
#   scripts/check_deb.sh --install-test PKG.deb  installs it with apt into a clean Debian chroot
#                                                (debootstrap, minbase), then builds and runs
#                                                examples/out_of_tree there with pkg-config and
#                                                CMake (root; needs the Debian mirror)
# Exit 0 when everything holds; the first fault is named otherwise.
set -euo pipefail
cd "$(dirname "$0")/.."
fail() { echo "check_deb: FAIL: $*"; exit 1; }
install_test=false
[ "${1:-}" = --install-test ] && { install_test=true; shift; }
deb=${1:?usage: check_deb.sh [--install-test] PKG.deb}
[ -f "$deb" ] || fail "no file $deb"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

if ! $install_test; then
    field() { dpkg-deb -f "$deb" "$1"; }
    for f in Package Version Architecture Maintainer Section Installed-Size Depends; do
        printf '%-15s %s\n' "$f:" "$(field "$f")"
    done
    [ "$(field Package)" = distgraph ] || fail "package name"
    ver=$(sed -n 's/^#define DG_VERSION_STRING "\(.*\)"/\1/p' include/distgraph/version.h)
    [ "$(field Version)" = "$ver" ] || fail "version $(field Version), version.h says $ver"
    dpkg-deb -c "$deb" | awk '{print $6}' | sed 's|^\./|/|' > "$tmp/files"
    grep -v '^/usr/' "$tmp/files" | grep -v '^/$' && fail "files outside /usr (above)"
    multiarch=$(dpkg-architecture -qDEB_HOST_MULTIARCH 2>/dev/null || gcc -print-multiarch)
    so=$(sed -n 's/^#define DG_SOVERSION \([0-9]*\)/\1/p' include/distgraph/version.h)
    lib=/usr/lib/$multiarch
    for f in /usr/include/distgraph/distgraph.h /usr/include/distgraph/version.h "$lib/libdistgraph.so.$ver" \
             "$lib/libdistgraph.so.$so" "$lib/libdistgraph.so" "$lib/libdistgraph.a" "$lib/pkgconfig/distgraph.pc" \
             "$lib/cmake/distgraph/distgraphConfig.cmake" "$lib/cmake/distgraph/distgraphConfigVersion.cmake" \
             /usr/bin/dg-server /usr/bin/dg-launch /usr/bin/dg-inspect /usr/share/doc/distgraph/SECURITY.md; do
        grep -qx "$f" "$tmp/files" || fail "$f is not in the package"
    done
    echo "files: $(grep -vc '/$' "$tmp/files") (headers: $(grep -c '^/usr/include/distgraph/.*\.h$' "$tmp/files"))"
    # Every library a binary of the package loads comes from a package it depends on.
    dpkg-deb -x "$deb" "$tmp/root"
    deps=$(field Depends | tr ',|' '\n\n' | sed 's/(.*)//; s/^ *//; s/ *$//' | sed '/^$/d' | sort -u)
    n=0
    while read -r elf; do
        for needed in $(readelf -d "$elf" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p'); do
            case $needed in libdistgraph.so.*) continue ;; esac
            path=$(ldconfig -p | awk -v n="$needed" '$1 == n && /x86-64|x86_64/ && !p {p = $NF} END {print p}')
            [ -n "$path" ] || fail "${elf#"$tmp/root"} needs $needed, which no library of this machine provides"
            real=$(readlink -f "$path")
            pkg=""
            # dpkg knows a file by the path its package ships (/lib or /usr/lib: merged /usr).
            for p in "$path" "$real" "${path#/usr}" "/usr$path" "${real#/usr}" "/usr$real"; do
                pkg=$(dpkg -S "$p" 2>/dev/null | sed -n '1s/:.*//p') || true
                [ -n "$pkg" ] && break
            done
            [ -n "$pkg" ] || fail "${elf#"$tmp/root"} needs $needed ($real), which no Debian package provides"
            if ! echo "$deps" | grep -qx "$pkg"; then
                # Or one step further: a dependency that depends on it (libopenblas0 on one of
                # libopenblas0-pthread, -openmp, -serial).
                via=""
                for d in $deps; do
                    apt-cache depends "$d" 2>/dev/null | grep -Eq "^ *\|?Depends: $pkg\$" && { via=$d; break; }
                done
                [ -n "$via" ] || fail "${elf#"$tmp/root"} needs $needed from $pkg, not among Depends: $(field Depends)"
            fi
            n=$((n + 1))
        done
    done < <(find "$tmp/root" -type f \( -name '*.so*' -o -path '*/bin/*' \) -exec sh -c 'file -b "$1" | grep -q ELF' _ {} \; -print)
    echo "dependencies: each of the $n libraries the package's binaries load comes from a package in Depends"
    echo "check_deb: ok"
    exit 0
fi

# --install-test: a clean Debian of this machine's release, the package installed with apt.
[ "$(id -u)" -eq 0 ] || fail "--install-test needs root (debootstrap, chroot)"
command -v debootstrap > /dev/null || DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap > /dev/null
suite=$(. /etc/os-release && echo "$VERSION_CODENAME")
mirror=$( (grep -rhoE 'https?://[^ ]+/debian/?( |$)' /etc/apt/sources.list /etc/apt/sources.list.d/*.sources \
    /etc/apt/sources.list.d/*.list 2>/dev/null || true) | head -1 | tr -d ' ')
mirror=${mirror:-http://deb.debian.org/debian}
root="$tmp/chroot"
echo "debootstrap $suite from $mirror into a temporary chroot (minbase)"
debootstrap --variant=minbase "$suite" "$root" "$mirror" > "$tmp/debootstrap.log" 2>&1 ||
    { tail -20 "$tmp/debootstrap.log"; fail "debootstrap"; }
cp "$deb" "$root/tmp/"
cp -r examples/out_of_tree "$root/tmp/proj"
mount -t proc proc "$root/proc"
trap 'umount "$root/proc" 2>/dev/null || true; rm -rf "$tmp"' EXIT
in_root() { chroot "$root" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root DEBIAN_FRONTEND=noninteractive "$@"; }
in_root apt-get update -qq > /dev/null
echo "apt install ./$(basename "$deb") in the clean chroot:"
in_root apt-get install -y --no-install-recommends "/tmp/$(basename "$deb")" > "$tmp/apt.log" 2>&1 ||
    { tail -30 "$tmp/apt.log"; fail "apt install of the package"; }
grep -E '^(Setting up|Unpacking) ' "$tmp/apt.log" | sed 's/^/  /' | head -40
in_root dg-server --help > /dev/null || fail "dg-server does not run after the install"
# A user's build tools, then the out-of-tree project both ways.
in_root apt-get install -y --no-install-recommends gcc libc6-dev make cmake > /dev/null 2>&1 ||
    fail "installing gcc, make and cmake in the chroot"
in_root sh -c 'cd /tmp/proj && make && ./train_linear --steps 200' || fail "pkg-config build in the chroot"
in_root sh -c 'cmake -S /tmp/proj -B /tmp/b > /dev/null && cmake --build /tmp/b > /dev/null && /tmp/b/train_linear --steps 200' ||
    fail "find_package build in the chroot"
echo "check_deb: the package installs with apt on a clean $suite and the out-of-tree project builds and runs"
