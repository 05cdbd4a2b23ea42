#!/usr/bin/env bash
# The shared library exports exactly the public interface: every dynamic symbol it defines is
# a dg_* function declared in include/distgraph/, each such declaration is exported, and the
# list is abi/distgraph.symbols (so an export added or lost by accident fails here, and a
# deliberate one shows in review as a change to that file). Also: the SONAME carries the
# interface version of version.h, and dg_version() is the header's version.
set -euo pipefail
src="${DG_SOURCE_DIR:?}"
lib="${DG_BIN_DIR:?}/../lib/libdistgraph.so"
fail() { echo "FAIL: $*"; exit 1; }
[ -f "$lib" ] || fail "no $lib (the distgraph_shared target)"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
nm -D --defined-only "$lib" | awk '$3 != "" {print $2, $3}' | sed 's/@.*//' > "$tmp/all"
# Text symbols only: version nodes (DISTGRAPH_0, type A) are not functions.
awk '$1 != "A" {print $2}' "$tmp/all" | sort -u > "$tmp/exported"
grep -v '^dg_' "$tmp/exported" && fail "symbols outside the dg_ namespace are exported (above)"
grep -v '^#' "$src/abi/distgraph.symbols" | sort -u > "$tmp/expected"
if ! diff -u "$tmp/expected" "$tmp/exported" > "$tmp/diff"; then
    cat "$tmp/diff"
    fail "the exported symbols differ from abi/distgraph.symbols (- expected, + exported)"
fi
# Declarations in the public headers: function names followed by '(' outside comments,
# preprocessor lines, typedefs and static inline definitions.
python3 - "$src/include/distgraph" "$tmp/exported" <<'PY'
import glob, re, sys
decl = set()
for f in glob.glob(sys.argv[1] + "/*.h"):
    t = open(f).read()
    t = re.sub(r"/\*.*?\*/", " ", t, flags=re.S)
    t = re.sub(r"//[^\n]*", " ", t)
    t = re.sub(r'#ifdef __cplusplus\s*extern "C" \{\s*#endif', " ", t)
    t = re.sub(r"#ifdef __cplusplus\s*\}\s*#endif", " ", t)
    t = "\n".join(l for l in t.split("\n") if not l.lstrip().startswith("#"))
    t = re.sub(r"\{[^{}]*\}", ";", t)          # struct bodies and inline function bodies
    t = re.sub(r"\{[^{}]*\}", ";", t)
    for stmt in t.split(";"):
        s = " ".join(stmt.split())
        if not s or "typedef" in s or s.startswith("static"):
            continue
        m = re.match(r"^(?:extern\s+)?[A-Za-z_][\w\s\*]*?\b(dg_\w+)\s*\(", s)
        if m:
            decl.add(m.group(1))
exp = set(open(sys.argv[2]).read().split())
missing, extra = sorted(decl - exp), sorted(exp - decl)
print(f"{len(decl)} functions declared in the public headers, {len(exp)} exported")
if missing:
    sys.exit("FAIL: declared but not exported: " + " ".join(missing))
if extra:
    sys.exit("FAIL: exported but declared in no public header: " + " ".join(extra))
PY
# Headers respect the layers: every function a public header declares is defined in one layer
# (graph <- cluster <- placer <- executor <- runtime), and a header, like each layer's sources,
# includes only public headers of its layer or of layers to its left.
for l in graph cluster placer executor runtime; do
    nm --defined-only "${DG_BIN_DIR}/../libdg_$l.a" 2> /dev/null | awk -v l="$l" '$2 == "T" && $3 ~ /^dg_/ {print $3, l}'
done > "$tmp/layer_of"
python3 - "$src/include/distgraph" "$tmp/layer_of" <<'PY'
import glob, os, re, sys
rank = {"graph": 0, "cluster": 1, "placer": 2, "executor": 3, "runtime": 4}
layer_of = dict(line.split() for line in open(sys.argv[2]))
header_layer, bad = {}, []
for f in sorted(glob.glob(sys.argv[1] + "/*.h")):
    t = re.sub(r"/\*.*?\*/", " ", open(f).read(), flags=re.S)
    t = re.sub(r"//[^\n]*", " ", t)
    names = {n for n in re.findall(r"\b(dg_\w+)\s*\(", t) if n in layer_of}
    layers = {layer_of[n] for n in names}
    h = os.path.basename(f)
    if len(layers) > 1:
        bad.append(f"{h} declares functions of several layers: " +
                   ", ".join(sorted(f"{n} ({layer_of[n]})" for n in names)))
    header_layer[h] = max(layers, key=rank.get) if layers else None
for f in sorted(glob.glob(sys.argv[1] + "/*.h")):
    h = os.path.basename(f)
    if not header_layer[h] or h == "distgraph.h":
        continue
    for inc in re.findall(r'#include "distgraph/([\w.]+)"', open(f).read()):
        il = header_layer.get(inc)
        if il and rank[il] > rank[header_layer[h]]:
            bad.append(f"{h} ({header_layer[h]}) includes {inc} ({il}), a layer to its right")
# A header without functions (types, or one that gathers others, as cluster.h) is of the layer
# of the rightmost header it includes; the sources of each layer include public headers of
# their layer or of layers to its left only (the include path cannot tell: every layer sees all
# of include/distgraph/).
includes = {os.path.basename(f): re.findall(r'#include "distgraph/([\w.]+)"', open(f).read())
            for f in glob.glob(sys.argv[1] + "/*.h")}
def layer(h, seen=()):
    if header_layer.get(h) or h == "distgraph.h" or h in seen:
        return header_layer.get(h)
    ls = [l for l in (layer(i, seen + (h,)) for i in includes.get(h, [])) if l]
    return max(ls, key=rank.get) if ls else None
root = os.path.dirname(os.path.dirname(os.path.abspath(sys.argv[1])))
n_src = 0
for l in rank:
    for f in sorted(glob.glob(f"{root}/{l}/**/*.[ch]", recursive=True) + glob.glob(f"{root}/{l}/**/*.cu", recursive=True)):
        n_src += 1
        for inc in re.findall(r'#include "distgraph/([\w.]+)"', open(f).read()):
            il = layer(inc)
            if il and rank[il] > rank[l]:
                bad.append(f"{os.path.relpath(f, root)} ({l}) includes distgraph/{inc} ({il}), a layer to its right")
print(f"layers: {sum(1 for v in header_layer.values() if v)} headers, each of one layer; {n_src} sources include none to their right")
if bad:
    sys.exit("FAIL: " + "; ".join(bad))
PY
soname=$(readelf -d "$lib" | sed -n 's/.*Library soname: \[\(.*\)\]/\1/p')
so=$(sed -n 's/^#define DG_SOVERSION \([0-9]*\)/\1/p' "$src/include/distgraph/version.h")
[ "$soname" = "libdistgraph.so.$so" ] || fail "SONAME $soname, version.h says libdistgraph.so.$so"
echo "exported: $(wc -l < "$tmp/exported") dg_ functions, SONAME $soname"
