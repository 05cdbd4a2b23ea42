#!/usr/bin/env python3
"""Check a JSON trace against the Chrome Trace Event Format (stdlib only).
  validate_trace.py TRACE.json [--strict]     exit 0: no errors (warnings allowed; --strict: none)
Rules (Trace Event Format doc, as catapult's and Perfetto's JSON importers read it):
  top level: [events] or {"traceEvents": [events], "displayTimeUnit": "ms"|"ns", ...}
  every event: object, "ph" a known phase; pid/tid integers; ts a number >= 0 (M may omit it);
    name a non-empty string (E may omit it); args an object if present; cat a string if present
  X: dur number >= 0 (tdur too if present)        B/E: balanced per (pid, tid), E not before its B
  i/I: s in g|p|t if present     C: args of numbers      b/n/e, S/T/p/F, O/N/D: id or id2
  s/t/f: id (or id2) and cat; bp only "e"; every f has an s with the same (cat, id) at or before
    it, every s an f; s (and f with bp "e") lie inside a slice of their thread (else the viewers
    drop or rebind the arrow)
  M: name in process_name/process_labels/process_sort_index/thread_name/thread_sort_index;
    *_name/labels: args.name string, *_sort_index: args.sort_index integer"""
import json, sys
from collections import defaultdict

PHASES = set("BEXiICbneSTpFstfPONDMVvRc()") | {"(", ")"}
META = {"process_name": "name", "thread_name": "name", "process_labels": "labels",
        "process_sort_index": "sort_index", "thread_sort_index": "sort_index"}


def num(x):
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def intlike(x):
    return isinstance(x, int) and not isinstance(x, bool)


def validate(doc):
    errs, warns = [], []
    if isinstance(doc, list):
        events = doc
    elif isinstance(doc, dict):
        events = doc.get("traceEvents")
        if not isinstance(events, list):
            return ["top level object has no traceEvents array"], warns
        dtu = doc.get("displayTimeUnit")
        if dtu is not None and dtu not in ("ms", "ns"):
            errs.append(f'displayTimeUnit must be "ms" or "ns", not {dtu!r}')
    else:
        return ["top level must be an array or an object"], warns

    stacks = defaultdict(list)           # (pid, tid) -> open B events
    slices = defaultdict(list)           # (pid, tid) -> [(start, end)]
    flow_s, flow_f, flow_anchor = {}, [], []
    for i, e in enumerate(events):
        where = f"event {i}"
        if not isinstance(e, dict):
            errs.append(f"{where}: not an object"); continue
        ph = e.get("ph")
        where = f"event {i} (ph {ph!r}, name {e.get('name')!r})"
        if ph not in PHASES:
            errs.append(f"{where}: unknown or missing ph"); continue
        for k in ("pid", "tid"):
            if k not in e:
                if not (ph == "M" and k == "tid" and str(e.get("name", "")).startswith("process_")):
                    errs.append(f"{where}: missing {k}")
            elif not intlike(e[k]):
                (warns if isinstance(e[k], str) else errs).append(f"{where}: {k} {e[k]!r} is not an integer")
        ts = e.get("ts")
        if ts is None:
            if ph != "M":
                errs.append(f"{where}: missing ts")
        elif not num(ts) or ts < 0:
            errs.append(f"{where}: ts {ts!r} is not a number >= 0")
        for k in ("tts",):
            if k in e and (not num(e[k]) or e[k] < 0):
                errs.append(f"{where}: {k} {e[k]!r} is not a number >= 0")
        name = e.get("name")
        if ph != "E" and (not isinstance(name, str) or not name):
            errs.append(f"{where}: missing or empty name")
        if "cat" in e and not isinstance(e["cat"], str):
            errs.append(f"{where}: cat is not a string")
        if "args" in e and not isinstance(e["args"], dict):
            errs.append(f"{where}: args is not an object")
        args = e.get("args") if isinstance(e.get("args"), dict) else {}
        key = (e.get("pid"), e.get("tid"))
        has_id = "id" in e or "id2" in e
        if "id" in e and not isinstance(e["id"], (int, str)):
            errs.append(f"{where}: id must be an integer or a string")

        if ph == "X":
            for k in ("dur", "tdur"):
                if k in e or k == "dur":
                    if not num(e.get(k)) or e[k] < 0:
                        errs.append(f"{where}: {k} {e.get(k)!r} is not a number >= 0")
            if num(ts) and num(e.get("dur")):
                slices[key].append((ts, ts + e["dur"]))
        elif ph == "B":
            stacks[key].append((i, e))
        elif ph == "E":
            if not stacks[key]:
                errs.append(f"{where}: E with no open B on pid {key[0]} tid {key[1]}")
            else:
                _, b = stacks[key].pop()
                if num(ts) and num(b.get("ts")):
                    if ts < b["ts"]:
                        errs.append(f"{where}: E before its B")
                    slices[key].append((b["ts"], ts))
        elif ph in "iI":
            if "s" in e and e["s"] not in ("g", "p", "t"):
                errs.append(f"{where}: instant scope s must be g, p or t")
        elif ph == "C":
            if not args or not all(num(v) for v in args.values()):
                errs.append(f"{where}: counter args must be a non-empty object of numbers")
        elif ph in "bneSTpFOND":
            if not has_id:
                errs.append(f"{where}: missing id")
            if ph in "bne" and "cat" not in e:
                warns.append(f"{where}: async event without cat (matched by cat + id)")
        elif ph in "stf":
            if not has_id:
                errs.append(f"{where}: flow event without id"); continue
            if "cat" not in e:
                errs.append(f"{where}: flow event without cat (matched by cat + id)")
            if "bp" in e and (ph == "s" or e["bp"] != "e"):
                errs.append(f"{where}: bp must be absent or \"e\" (on t/f only)")
            fid = (e.get("cat"), json.dumps(e.get("id", e.get("id2")), sort_keys=True))
            if ph == "s":
                if fid in flow_s:
                    warns.append(f"{where}: flow id {fid} started again")
                flow_s[fid] = (i, ts)
            elif ph == "f":
                flow_f.append((where, fid, ts))
            if ph == "s" or e.get("bp") == "e":
                flow_anchor.append((where, key, ts))
        elif ph == "M":
            if name not in META:
                warns.append(f"{where}: unusual metadata name")
            else:
                field = META[name]
                v = args.get(field)
                if field == "sort_index":
                    if not intlike(v):
                        errs.append(f"{where}: args.sort_index must be an integer")
                elif not isinstance(v, str) or not v:
                    errs.append(f"{where}: args.{field} must be a non-empty string")

    for key, st in stacks.items():
        for i, b in st:
            warns.append(f"event {i} (B {b.get('name')!r}): never ended on pid {key[0]} tid {key[1]}")
    matched = set()
    for where, fid, ts in flow_f:
        s = flow_s.get(fid)
        if s is None:
            errs.append(f"{where}: flow end with no start for cat/id {fid}")
        else:
            matched.add(fid)
            if num(ts) and num(s[1]) and ts < s[1]:
                errs.append(f"{where}: flow end before its start (event {s[0]})")
    for fid, (i, _) in flow_s.items():
        if fid not in matched:
            warns.append(f"event {i}: flow start with no end for cat/id {fid}")
    for where, key, ts in flow_anchor:
        if num(ts) and not any(a <= ts <= b for a, b in slices[key]):
            warns.append(f"{where}: flow point at ts {ts} is inside no slice of pid {key[0]} tid {key[1]}")
    return errs, warns


def main():
    args = [a for a in sys.argv[1:] if a != "--strict"]
    if len(args) != 1:
        sys.exit(__doc__)
    try:
        with open(args[0]) as f:
            doc = json.load(f)
    except (OSError, ValueError) as ex:
        print(f"error: {ex}"); return 1
    errs, warns = validate(doc)
    for m in errs:
        print("error:", m)
    for m in warns:
        print("warning:", m)
    n = len(doc if isinstance(doc, list) else doc.get("traceEvents", []))
    print(f"{args[0]}: {n} events, {len(errs)} errors, {len(warns)} warnings")
    return 1 if errs or ("--strict" in sys.argv and warns) else 0


if __name__ == "__main__":
    sys.exit(main())
