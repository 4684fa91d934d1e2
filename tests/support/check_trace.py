#!/usr/bin/env python3
"""Validates a Chrome trace (Trace Event Format JSON) written by ddp-train's tracer.

Checks the structure viewers rely on (fields, units, metadata), that spans on one track nest
or are disjoint, and that the requested ranks, spans and tracks are all there. Exit 0 with a
one-line summary, or 1 listing the first problems found. Python 3 standard library only.

usage: check_trace.py TRACE.json [--ranks N] [--require-span NAME]... [--require-track NAME]...
A NAME ending in '*' matches every name with that prefix.
"""
import argparse
import json
import math
import sys

SLACK_US = 1e-3  # timestamps are printed doubles; allow this much rounding when nesting spans
MAX_SHOWN = 10
METADATA_ARGS = {  # metadata event name -> (required arg, its type)
    "process_name": ("name", str),
    "thread_name": ("name", str),
    "process_sort_index": ("sort_index", int),
    "thread_sort_index": ("sort_index", int),
    "process_labels": ("labels", str),
}
PHASES = set("BEXiIPCbnesftpOND") | {"M", "R", "c", "(", ")", "v", "V"}


def reject_constant(name):
    raise ValueError("%s is not valid JSON" % name)


def is_int(x):
    return isinstance(x, int) and not isinstance(x, bool)


def is_number(x):
    return (isinstance(x, (int, float)) and not isinstance(x, bool)
            and math.isfinite(x))


def matches(pattern, name):
    if pattern.endswith("*"):
        return name.startswith(pattern[:-1])
    return name == pattern


def describe(index, event):
    return "event %d (%s)" % (index, json.dumps(event, sort_keys=True)[:160])


def check_event(index, e, problems):
    """Checks one event's own fields; returns True when it can be used further."""
    if not isinstance(e, dict):
        problems.append("%s: not an object" % describe(index, e))
        return False
    missing = [k for k in ("ph", "pid", "tid") if k not in e]
    if missing:
        problems.append("%s: missing %s" % (describe(index, e), ", ".join(missing)))
        return False
    ph = e["ph"]
    if ph not in PHASES:
        problems.append("%s: unknown ph %r" % (describe(index, e), ph))
        return False
    if not is_int(e["pid"]) or not is_int(e["tid"]):
        problems.append("%s: pid and tid must be integers" % describe(index, e))
        return False
    if not isinstance(e.get("name", ""), str):
        problems.append("%s: name must be a string" % describe(index, e))
        return False
    if "args" in e and not isinstance(e["args"], dict):
        problems.append("%s: args must be an object" % describe(index, e))
        return False
    if ph == "M":
        name = e.get("name")
        if name not in METADATA_ARGS:
            problems.append("%s: unknown metadata name %r" % (describe(index, e), name))
            return False
        key, kind = METADATA_ARGS[name]
        value = e.get("args", {}).get(key)
        if not (is_int(value) if kind is int else isinstance(value, kind)):
            problems.append("%s: %s needs args.%s (%s)" %
                            (describe(index, e), name, key, kind.__name__))
            return False
        return True
    if "name" not in e:
        problems.append("%s: missing name" % describe(index, e))
        return False
    if not is_number(e.get("ts")):
        problems.append("%s: ts must be a finite number" % describe(index, e))
        return False
    if ph == "X":
        if e["ts"] < 0:
            problems.append("%s: negative ts" % describe(index, e))
            return False
        if not is_number(e.get("dur")) or e["dur"] < 0:
            problems.append("%s: dur must be a number >= 0" % describe(index, e))
            return False
    if ph == "C":
        args = e.get("args")
        if not args or not all(is_number(v) for v in args.values()):
            problems.append("%s: a counter needs numeric args" % describe(index, e))
            return False
    if ph in ("i", "I") and e.get("s", "t") not in ("g", "p", "t"):
        problems.append("%s: instant scope must be g, p or t" % describe(index, e))
        return False
    return True


def check_nesting(spans_by_track, thread_names, problems):
    """Spans on one (pid, tid) must nest or be disjoint; a partial overlap is a problem."""
    for (pid, tid), spans in sorted(spans_by_track.items()):
        spans.sort(key=lambda s: (s[0], -s[1]))
        stack = []  # (begin, end, name) of the enclosing spans
        for begin, dur, name in spans:
            end = begin + dur
            while stack and stack[-1][1] <= begin + SLACK_US:
                stack.pop()
            if stack and end > stack[-1][1] + SLACK_US:
                outer = stack[-1]
                track = thread_names.get((pid, tid), "tid %d" % tid)
                problems.append(
                    "rank %d track %r: span %r [%.3f, %.3f] us partially overlaps %r [%.3f, %.3f]"
                    % (pid, track, name, begin, end, outer[2], outer[0], outer[1]))
                continue
            stack.append((begin, end, name))


def validate(trace, ranks, require_spans, require_tracks):
    """Returns (problems, summary)."""
    problems = []
    if not isinstance(trace, dict):
        return ["the top level is not a JSON object"], None
    events = trace.get("traceEvents")
    if not isinstance(events, list):
        return ["traceEvents is missing or not a list"], None
    unit = trace.get("displayTimeUnit", "ms")
    if unit not in ("ms", "ns"):
        problems.append("displayTimeUnit must be \"ms\" or \"ns\", not %r" % (unit,))

    process_names = {}  # pid -> name
    thread_names = {}  # (pid, tid) -> name
    span_names = {}  # pid -> set of X event names
    spans_by_track = {}  # (pid, tid) -> [(ts, dur, name)]
    pids = set()
    for index, e in enumerate(events):
        if not check_event(index, e, problems):
            continue
        pid, tid, ph = e["pid"] - 1, e["tid"], e["ph"]  # pid = rank + 1
        pids.add(pid)
        if ph == "M" and e["name"] in ("process_name", "thread_name"):
            table, key = ((process_names, pid) if e["name"] == "process_name" else
                          (thread_names, (pid, tid)))
            name = e["args"]["name"]
            if key in table and table[key] != name:
                problems.append("%s: %s %r given twice (was %r)" %
                                (describe(index, e), e["name"], name, table[key]))
            table[key] = name
        elif ph == "X":
            span_names.setdefault(pid, set()).add(e["name"])
            spans_by_track.setdefault((pid, tid), []).append((e["ts"], e["dur"], e["name"]))

    check_nesting(spans_by_track, thread_names, problems)

    if ranks is not None:
        expected = list(range(ranks))
        for r in expected:
            if r not in process_names:
                problems.append("rank %d: no process_name metadata (pid %d)" % (r, r + 1))
        extra = sorted(p for p in pids if not 0 <= p < ranks)
        if extra:
            problems.append("--ranks %d, but the trace has events for pid(s) %s" %
                            (ranks, ", ".join(str(p + 1) for p in extra)))
    else:
        expected = sorted(pids)
        for p in expected:
            if p not in process_names:
                problems.append("pid %d: no process_name metadata" % (p + 1))
    if not expected:
        problems.append("the trace has no ranks")

    for pattern in require_spans:
        for r in expected:
            if not any(matches(pattern, n) for n in span_names.get(r, ())):
                problems.append("rank %d: no span named %r" % (r, pattern))
    for pattern in require_tracks:
        for r in expected:
            names = [n for (p, _), n in thread_names.items() if p == r]
            if not any(matches(pattern, n) for n in names):
                problems.append("rank %d: no track named %r" % (r, pattern))

    summary = "trace ok: %d ranks, %d events, %d tracks" % (len(expected), len(events),
                                                           len(thread_names))
    return problems, summary


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trace", help="the trace JSON file")
    parser.add_argument("--ranks", type=int, help="ranks 0..N-1 must all be present")
    parser.add_argument("--require-span", action="append", default=[], metavar="NAME",
                        help="a span every rank must have (NAME* matches a prefix)")
    parser.add_argument("--require-track", action="append", default=[], metavar="NAME",
                        help="a track (thread_name) every rank must have (NAME* matches a prefix)")
    args = parser.parse_args(argv)
    if args.ranks is not None and args.ranks < 1:
        parser.error("--ranks must be >= 1")

    try:
        with open(args.trace, encoding="utf-8") as f:
            trace = json.load(f, parse_constant=reject_constant)
    except (OSError, UnicodeDecodeError, ValueError) as err:
        print("trace invalid: %s: %s" % (args.trace, err))
        return 1

    problems, summary = validate(trace, args.ranks, args.require_span, args.require_track)
    if problems:
        print("trace invalid: %s: %d problem(s)" % (args.trace, len(problems)))
        for p in problems[:MAX_SHOWN]:
            print("  " + p)
        if len(problems) > MAX_SHOWN:
            print("  ... and %d more" % (len(problems) - MAX_SHOWN))
        return 1
    print(summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
