#!/usr/bin/python3
"""The bubble of a pipelined step, from its Chrome trace (gpt_replica --trace_step N
--trace_file FILE; docs/PIPELINES.md): the window from the first kernel of a pipeline piece
("<name>/s<k>/mb<i>/fwd|bwd|recompute/...") to the last one's end on any task, each task's busy
time (the union of its kernels' intervals within the window), and its idle fraction. Prints one
JSON line: the mean over tasks ("bubble"), each task's, the window in ms, and each task's pieces
in the order they ran ("F0 F1 B0 ...", a piece at the start of its first kernel).

  bench/pipeline_bubble.py TRACE.json [--name pipeline] [--svg FILE]

--svg also draws the pieces as a picture: one lane per task, each piece a box from its first
kernel's start to its last kernel's end (forward passes blue, backward passes orange), labelled
with its micro-batch.
"""
import argparse
import collections
import json
import re
import sys


def union_length(intervals):
    total, cur = 0.0, None
    for s, t in sorted(intervals):
        if cur is None or s > cur[1]:
            if cur:
                total += cur[1] - cur[0]
            cur = [s, t]
        else:
            cur[1] = max(cur[1], t)
    return total + (cur[1] - cur[0] if cur else 0.0)


def write_svg(path, tasks, spans, lo, hi):
    width, lane, left = 960, 34, 190
    scale = (width - left - 10) / (hi - lo)
    lanes = sorted(tasks, key=lambda t: ("worker" not in t, t))
    out = ['<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif" '
           'font-size="11">' % (width, lane * len(lanes) + 40)]
    for i, t in enumerate(lanes):
        y = 10 + i * lane
        stages = sorted({k[3] for k in spans if k[0] == t})
        out.append('<text x="4" y="%d">stage %s: %s</text>' % (y + 20, ",".join(map(str, stages)),
                                                              t.replace("/replica:0", "")))
        for (tk, ph, mb, _), (s0, s1) in sorted(spans.items()):
            if tk != t:
                continue
            x = left + (s0 - lo) * scale
            w = max(1.0, (s1 - s0) * scale)
            out.append('<rect x="%.1f" y="%d" width="%.1f" height="%d" fill="%s" stroke="white"/>'
                       % (x, y + 4, w, lane - 8, "#4a78c2" if ph == "F" else "#e08a2c"))
            out.append('<text x="%.1f" y="%d" fill="white">%s%d</text>' % (x + 2, y + 21, ph, mb))
    y = 10 + len(lanes) * lane
    out.append('<text x="%d" y="%d">0 ms</text>' % (left, y + 14))
    out.append('<text x="%d" y="%d" text-anchor="end">%.0f ms</text>' % (width - 10, y + 14, (hi - lo) / 1000))
    out.append("</svg>")
    with open(path, "w") as f:
        f.write("\n".join(out) + "\n")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("trace")
    ap.add_argument("--name", default="pipeline")
    ap.add_argument("--svg", default="")
    a = ap.parse_args()
    d = json.load(open(a.trace))
    ev = d["traceEvents"] if isinstance(d, dict) else d
    task = {e["pid"]: e["args"]["name"] for e in ev if e.get("ph") == "M" and e.get("name") == "process_name"}
    ops = [e for e in ev if e.get("cat") == "op" and e.get("ph") == "X"]
    piece = re.compile(r"^%s/s(\d+)/mb(\d+)/(fwd|bwd|recompute)/" % re.escape(a.name))
    pipe = [(e, piece.match(e["name"])) for e in ops]
    pipe = [(e, m) for e, m in pipe if m]
    if not pipe:
        print(json.dumps({"error": "no kernel of a pipeline piece named %s/s<k>/mb<i>/... in %s" % (a.name, a.trace)}))
        return 1
    lo = min(e["ts"] for e, _ in pipe)
    hi = max(e["ts"] + e["dur"] for e, _ in pipe)
    busy = collections.defaultdict(list)
    for e in ops:
        s, t = max(e["ts"], lo), min(e["ts"] + e["dur"], hi)
        if t > s:
            busy[task.get(e["pid"], str(e["pid"]))].append((s, t))
    first = {}
    for e, m in pipe:
        key = (task.get(e["pid"], str(e["pid"])), int(m.group(1)), "F" if m.group(3) == "fwd" else "B", int(m.group(2)))
        first[key] = min(first.get(key, e["ts"]), e["ts"])
    tasks = sorted(t for t in busy if any(k[0] == t for k in first))
    idle = {t: 1 - union_length(busy[t]) / (hi - lo) for t in tasks}
    order = {t: " ".join("%s%d" % (k[2], k[3]) for k, _ in sorted(((k, v) for k, v in first.items() if k[0] == t),
                                                                 key=lambda kv: kv[1])) for t in tasks}
    if a.svg:
        spans = {}
        for e, m in pipe:
            key = (task.get(e["pid"], str(e["pid"])), "F" if m.group(3) == "fwd" else "B", int(m.group(2)),
                   int(m.group(1)))
            s0, s1 = spans.get(key, (e["ts"], e["ts"] + e["dur"]))
            spans[key] = (min(s0, e["ts"]), max(s1, e["ts"] + e["dur"]))
        write_svg(a.svg, tasks, spans, lo, hi)
    print(json.dumps({"window_ms": round((hi - lo) / 1000, 3), "bubble": round(sum(idle.values()) / len(idle), 4),
                      "tasks": {t: round(v, 4) for t, v in idle.items()}, "order": order}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
