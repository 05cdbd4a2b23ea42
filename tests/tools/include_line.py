#!/usr/bin/env python3
"""Every part of the code sees the private headers of the parts to its left, never to its right.

    tests/tools/include_line.py BUILD_DIR SOURCE_DIR

The parts, left to right: the layers graph, cluster, placer, executor, the runtime's rooms transport,
server, master, session, training, data, then the tools. For each part this takes the compile
command of one of its sources (BUILD_DIR/compile_commands.json: its include path, defines and
warnings), and compiles a probe that includes one header of every folder of every part to its
right.
A header of a part to the right must not be found. The control, a probe of the part's own
header (or, for the tools, which see only the public headers, of one of those), must compile:
a probe that could not compile anything would prove nothing. Also fails on an
include that climbs out of its folder ("../"), which no include path governs.
"""
import glob
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile

PARTS = [
    ("graph", ["graph"]),
    ("cluster", ["cluster"]),
    ("placer", ["placer"]),
    ("executor", ["executor", "executor/cpu", "executor/cuda", "executor/cuda/kernels"]),
    ("runtime/transport", ["runtime/transport"]),
    ("runtime/server", ["runtime/server"]),
    ("runtime/master", ["runtime/master"]),
    ("runtime/session", ["runtime/session"]),
    ("runtime/training", ["runtime/training"]),
    ("runtime/data", ["runtime/data"]),
    ("tools", ["tools", "tools/inspect"]),
]


def part_of(rel):
    d = os.path.dirname(rel)
    for i, (_, dirs) in enumerate(PARTS):
        if d in dirs:
            return i
    return None


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    build, src = sys.argv[1], os.path.realpath(sys.argv[2])
    with open(os.path.join(build, "compile_commands.json")) as f:
        entries = json.load(f)
    command = {}   # part index -> (directory, argv, source) of a C source in its first folder
    for e in entries:
        rel = os.path.relpath(os.path.realpath(e["file"]), src)
        i = part_of(rel)
        if i is None or i in command or not rel.endswith(".c") or os.path.dirname(rel) != PARTS[i][1][0]:
            continue
        command[i] = (e["directory"], shlex.split(e["command"]) if "command" in e else e["arguments"], rel)
    headers = {}   # part index -> one header per folder
    for i, (_, dirs) in enumerate(PARTS):
        headers[i] = [os.path.relpath(sorted(glob.glob(os.path.join(src, d, "*.h")))[0], src)
                      for d in dirs if glob.glob(os.path.join(src, d, "*.h"))]
    bad, probes = [], 0
    tmp = tempfile.mkdtemp(prefix="dg-include-line-")
    try:
        for i, (name, _) in enumerate(PARTS):
            if i not in command:
                continue   # not built here (no tools in this build, say)
            cwd, argv, rel = command[i]
            # The source and the object out; the probe in, syntax only.
            args, skip = [], False
            for a in argv:
                if skip:
                    skip = False
                    continue
                if a == "-o":
                    skip = True
                    continue
                if a in ("-c", os.path.join(src, rel)) or os.path.realpath(a) == os.path.join(src, rel):
                    continue
                args.append(a)
            # The control: the part's own folder when it is on its include path (a layer's,
            # a room's), else the public headers (the tools see only those).
            own = os.path.join(src, PARTS[i][1][0])
            on_path = any(a.startswith("-I") and os.path.realpath(a[2:]) == own for a in args)
            own_h = [h for h in headers[i] if os.path.dirname(h) == PARTS[i][1][0]]
            control = own_h[0] if on_path and own_h else "distgraph/status.h"
            for j, hs in [(i, [control])] + [(j, hs) for j, hs in headers.items() if j > i]:
                for h in hs:
                    probe = os.path.join(tmp, "probe.c")
                    with open(probe, "w") as f:
                        f.write('#include "%s"\n' % (h if h.startswith("distgraph/") else os.path.basename(h)))
                    p = subprocess.run(args + ["-fsyntax-only", probe], cwd=cwd, stdout=subprocess.PIPE,
                                       stderr=subprocess.STDOUT, text=True)
                    probes += 1
                    missing = "No such file or directory" in p.stdout and os.path.basename(h) in p.stdout
                    if j > i and not missing:
                        bad.append("%s (compiled as %s) can include %s, a header of %s to its right"
                                   % (name, rel, h, PARTS[j][0]))
                    elif j == i and p.returncode != 0:
                        bad.append("%s (compiled as %s) cannot compile the control probe of %s: the probe "
                                   "is broken:\n%s" % (name, rel, h, p.stdout[-800:]))
    finally:
        for f in glob.glob(os.path.join(tmp, "*")):
            os.remove(f)
        os.rmdir(tmp)
    climbing = []
    for _, dirs in PARTS:
        for d in dirs:
            for f in sorted(glob.glob(os.path.join(src, d, "*.[ch]"))):
                with open(f, errors="replace") as fh:
                    for n, line in enumerate(fh, 1):
                        if re.match(r'\s*#\s*include\s*"[^"]*\.\./', line):
                            climbing.append("%s:%d: %s" % (os.path.relpath(f, src), n, line.strip()))
    for b in bad:
        print("FAIL: " + b)
    for c in climbing:
        print("FAIL: an include out of its folder (no include path governs it): " + c)
    print("include_line: %d parts built, %d probes, %d wrong" % (len(command), probes, len(bad) + len(climbing)))
    if len(command) < 8:
        print("FAIL: only %d parts have a compile command (is the build configured?)" % len(command))
        return 1
    return 1 if bad or climbing else 0


if __name__ == "__main__":
    sys.exit(main())
