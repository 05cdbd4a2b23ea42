#!/usr/bin/env python3
"""Which source files use each other's functions, read from the object files.

    tests/tools/source_circles.py BUILD_DIR SOURCE_DIR [--list]

For every object file of the layers and tools (as BUILD_DIR/compile_commands.json lists them), nm
gives the global symbols it defines and the ones it uses; file A uses file B when A uses a
symbol B defines. A circle is a set of two or more files each reaching every other through
such uses (a strongly connected component). Prints every pair of files that use each other
and every circle, then fails when
  - a circle has a file in runtime/, or files of two layers (graph, cluster, placer, executor,
    runtime, tools), and docs/ARCHITECTURE.md does not name it;
  - a circle docs/ARCHITECTURE.md names is gone (the page must stay true).
A circle elsewhere (inside graph/, say) is printed, and must be named too: the page lists every
circle kept with its reason, one line each: "- circle: FILE FILE ...: reason".
"""
import json
import os
import re
import shlex
import subprocess
import sys

LAYERS = ["graph", "cluster", "placer", "executor", "runtime", "tools"]


def objects(build, src):
    """(source path, object path) of the layers' and tools' objects, from compile_commands.json
    (so that objects of sources since removed, left in the build directory, are not read)."""
    path = os.path.join(build, "compile_commands.json")
    try:
        with open(path) as f:
            entries = json.load(f)
    except (OSError, ValueError) as e:
        sys.exit("source_circles: cannot read %s: %s" % (path, e))
    out = []
    for e in entries:
        rel = os.path.relpath(os.path.realpath(e["file"]), os.path.realpath(src))
        if rel.split(os.sep)[0] not in LAYERS:
            continue   # generated code (the protobuf-c file), examples, benchmarks, tests
        args = shlex.split(e["command"]) if "command" in e else e["arguments"]
        if "-o" not in args:
            continue
        obj = os.path.join(e["directory"], args[args.index("-o") + 1])
        if os.path.exists(obj):
            out.append((rel, obj))
    return out


def symbols(obj):
    p = subprocess.run(["nm", "-P", obj], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if p.returncode != 0:
        sys.exit("source_circles: nm %s failed: %s" % (obj, p.stderr.strip()))
    defs, uses = set(), set()
    for line in p.stdout.splitlines():
        parts = line.split()
        if len(parts) < 2:
            continue
        name, kind = parts[0], parts[1]
        if kind == "U":
            uses.add(name)
        elif kind in "TDBRCVWG" and kind.isupper():
            defs.add(name)
    return defs, uses


def circles(nodes, edges):
    """Strongly connected components of two or more nodes (Tarjan, iterative)."""
    index, low, on, stack, out, counter = {}, {}, set(), [], [], [0]
    for root in sorted(nodes):
        if root in index:
            continue
        work = [(root, iter(sorted(edges.get(root, ()))))]
        index[root] = low[root] = counter[0]
        counter[0] += 1
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            nxt = next(it, None)
            if nxt is not None:
                if nxt not in index:
                    index[nxt] = low[nxt] = counter[0]
                    counter[0] += 1
                    stack.append(nxt)
                    on.add(nxt)
                    work.append((nxt, iter(sorted(edges.get(nxt, ())))))
                elif nxt in on:
                    low[v] = min(low[v], index[nxt])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return sorted(out)


def named_circles(page):
    """The circles docs/ARCHITECTURE.md keeps: lines '- circle: FILE FILE ...: reason'."""
    named = []
    with open(page) as f:
        for n, line in enumerate(f, 1):
            m = re.match(r"^- circle: ((?:`?[\w./-]+`?\s*)+):", line)
            if m:
                named.append((sorted(w.strip("`") for w in m.group(1).split()), n))
    return named


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    if len(args) != 2:
        sys.exit(__doc__)
    build, src = args
    objs = objects(build, src)
    if len(objs) < 40:
        sys.exit("source_circles: found only %d objects of %s/compile_commands.json (is it built?)" % (len(objs), build))
    defs_of, uses_of, definer = {}, {}, {}
    for rel, obj in objs:
        d, u = symbols(obj)
        defs_of.setdefault(rel, set()).update(d)
        uses_of.setdefault(rel, set()).update(u)
    for rel, d in defs_of.items():
        for s in d:
            definer.setdefault(s, set()).add(rel)
    edges, why = {}, {}
    for rel, u in uses_of.items():
        for s in u:
            for other in definer.get(s, ()):
                if other != rel:
                    edges.setdefault(rel, set()).add(other)
                    why.setdefault((rel, other), set()).add(s)
    pairs = sorted({tuple(sorted((a, b))) for a in edges for b in edges[a] if a in edges.get(b, ())})
    found = circles(set(defs_of), edges)
    print("source_circles: %d objects, %d files using another's functions" % (len(objs), len(edges)))
    for a, b in pairs:
        print("pair: %s <-> %s (%s | %s)" % (a, b, ", ".join(sorted(why[(a, b)])[:4]),
                                            ", ".join(sorted(why[(b, a)])[:4])))
    page = os.path.join(src, "docs", "ARCHITECTURE.md")
    # A build without CUDA has no objects of executor/cuda/: a named circle is compared over
    # the files this build has.
    built = set(defs_of)
    named = [([f for f in files if f in built], line) for files, line in named_circles(page)]
    named = [(files, line) for files, line in named if len(files) > 1]
    bad = 0
    for comp in found:
        layers = {f.split(os.sep)[0] for f in comp}
        where = "across layers" if len(layers) > 1 else "inside %s/" % next(iter(layers))
        listed = any(n == comp for n, _ in named)
        print("circle (%s)%s: %s" % (where, "" if listed else " NOT NAMED", " ".join(comp)))
        for a in comp:
            for b in comp:
                if (a, b) in why:
                    print("    %s uses %s: %s" % (a, b, ", ".join(sorted(why[(a, b)])[:6])))
        if not listed:
            bad += 1
            print("FAIL: this circle is not named in docs/ARCHITECTURE.md ('- circle: FILES: reason'); "
                  "%s" % ("untie it: runtime/ and the layers allow none" if "runtime" in layers or len(layers) > 1
                          else "untie it or name it with its reason"))
    for n, line in named:
        if n not in found:
            bad += 1
            print("FAIL: docs/ARCHITECTURE.md line %d names a circle that is gone: %s" % (line, " ".join(n)))
    if "--list" in sys.argv:
        return 0
    print("source_circles: %d pairs, %d circles, %s" % (len(pairs), len(found), "FAILED" if bad else "all named"))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
