#!/usr/bin/python3
"""The bubble of a pipelined step, from its Chrome trace (gpt_replica --trace_step N
--trace_file FILE; docs/PIPELINES.md): the window from the first kernel of a pipeline piece
("<name>/s<k>/mb<i>/fwd|bwd|recompute/...") to the last one's end on any task, each task's busy
time (the union of its kernels' intervals within the window), and its idle fraction. Prints one
JSON line: the mean over tasks ("bubble"), each task's, the window in ms, and each task's pieces
in the order they ran ("F0 F1 B0 ...", a piece at the start of its first kernel). Beside it:
"bubble_waits", the idle time spent waiting for another task's values only (see
waiting_fraction: not the executor's time between kernels); and "simulated", the step the
same pieces would take with nothing between them (see simulate): its window and bubble (the
schedule's bubble for the pieces as they ran, unequal or not) and "overhead", how much longer the
measured window was (transfers, hand-offs, the executor's time between kernels).

  bench/pipeline_bubble.py TRACE.json [--name pipeline] [--svg FILE] [--split_backward]

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


def merged(intervals):
    out = []
    for s, t in sorted(intervals):
        if out and s <= out[-1][1]:
            out[-1][1] = max(out[-1][1], t)
        else:
            out.append([s, t])
    return out


def waiting_fraction(intervals, arrivals, lo, hi):
    """The part of [lo, hi] a task spent waiting for another task: before its first kernel and
    after its last one (the pipeline filling and draining), and in a gap between two kernels up
    to the last value that arrived from another task within the gap. The rest of a gap (no value
    arrived in it, or after the last arrival) is the executor's own time between kernels, which
    a traced step inflates, not the schedule's."""
    runs = merged(intervals)
    if not runs:
        return 1.0
    wait = (runs[0][0] - lo) + (hi - runs[-1][1])
    for (_, a), (b, _) in zip(runs, runs[1:]):
        inside = [t for t in arrivals if a < t <= b]
        if inside:
            wait += max(inside) - a
    return wait / (hi - lo)


def simulate(work, first, stage_task):
    """The step the trace's own pieces would take with nothing between them: each piece as long as
    its kernels' total time, each task running its pieces in the order they ran, a forward piece
    after the previous stage's forward of its micro-batch, a backward piece after its own
    forward and the next stage's backward. Returns (makespan, mean idle fraction) in the trace's
    unit, or None where the schedule splits its backward pass (ZB-H1's W parts are not named
    apart, so its pieces cannot be told from the trace)."""
    last = max(k[0] for k in work)
    order = collections.defaultdict(list)
    for k in sorted(first, key=first.get):
        order[stage_task[k[0]]].append(k)

    def deps(k):
        s, ph, mb = k
        if ph == "F":
            return [(s - 1, "F", mb)] if s > 0 else []
        return [(s, "F", mb)] + ([(s + 1, "B", mb)] if s < last else [])

    end, free, pos = {}, collections.defaultdict(float), {t: 0 for t in order}
    moved = True
    while moved:
        moved = False
        for t, ks in order.items():
            while pos[t] < len(ks) and all(d in end for d in deps(ks[pos[t]])):
                k = ks[pos[t]]
                end[k] = max([free[t]] + [end[d] for d in deps(k)]) + work[k]
                free[t] = end[k]
                pos[t] += 1
                moved = True
    if len(end) != len(work):
        return None
    span = max(end.values())
    busy = [sum(work[k] for k in ks) for ks in order.values()]
    return span, 1 - sum(busy) / len(busy) / span


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
    ap.add_argument("--split_backward", action="store_true", help="ZB-H1: no simulation (see simulate)")
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
    arrivals = collections.defaultdict(list)   # a value from another task ready here (its transfer's end)
    for e in ev:
        if e.get("cat") == "transfer" and e.get("ph") == "X" and "from" in e.get("args", {}):
            arrivals[task.get(e["pid"], str(e["pid"]))].append(e["ts"] + e["dur"])
    waits = {t: waiting_fraction(busy[t], arrivals[t], lo, hi) for t in tasks}
    work, stage_task = collections.defaultdict(float), {}
    for e, m in pipe:
        key = (int(m.group(1)), "F" if m.group(3) == "fwd" else "B", int(m.group(2)))
        work[key] += e["dur"]
        stage_task[key[0]] = task.get(e["pid"], str(e["pid"]))
    sim = None if a.split_backward else simulate(work, {(k[1], k[2], k[3]): v for k, v in first.items()}, stage_task)
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
                      "tasks": {t: round(v, 4) for t, v in idle.items()},
                      "bubble_waits": round(sum(waits.values()) / len(waits), 4),
                      "tasks_waits": {t: round(v, 4) for t, v in waits.items()},
                      "simulated": {"window_ms": round(sim[0] / 1000, 3), "bubble": round(sim[1], 4),
                                    "overhead": round((hi - lo) / sim[0] - 1, 4)} if sim else None,
                      "order": order}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
