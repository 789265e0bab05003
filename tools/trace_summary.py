#!/usr/bin/env python3
"""Sums up a CLMLA_TRACE file: per command name, how many ran, the median and total device time,
and the median idle gap before it (its start minus the end of the command before it on the same
queue: launch overhead, host work between commands).

  CLMLA_TRACE=/tmp/trace.tsv clmla-bench --phase layer --batch 1 --ctx 4096
  python3 tools/trace_summary.py /tmp/trace.tsv [--context N] [--skip N]

--skip N drops each context's first N commands (first calls: compiles, cold caches). --per NAME
adds a column of each command's time per call of NAME (per step, with a kernel the step runs once,
such as attn_latent_rows or attn_latent for a decode step) and their sum. Gaps longer
than --max-gap-us (default 1000) are left out of the gap medians: between timed calls a benchmark
flushes caches or waits on the host, which is not the queue's overhead.
"""
import argparse
import statistics
import sys


def read(path, context):
    """{context: [(kind, name, size, queued, submitted, started, ended)]} in file order."""
    runs = {}
    with open(path) as f:
        for line in f:
            if line.startswith("#") or not line.strip():
                continue
            parts = line.rstrip("\n").split("\t")
            if len(parts) != 8:
                sys.exit(f"trace_summary: not a CLMLA_TRACE line: {line.strip()!r}")
            ctx = int(parts[0])
            if context is not None and ctx != context:
                continue
            times = [int(v) for v in parts[4:]]
            runs.setdefault(ctx, []).append((parts[1], parts[2], parts[3], *times))
    return runs


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("trace")
    ap.add_argument("--context", type=int, help="only this context (the first column)")
    ap.add_argument("--skip", type=int, default=0, help="drop each context's first N commands")
    ap.add_argument("--max-gap-us", type=float, default=1000.0)
    ap.add_argument("--per", metavar="NAME", help="also each command's time per call of the command NAME")
    a = ap.parse_args()

    runs = read(a.trace, a.context)
    if not runs:
        sys.exit("trace_summary: no commands in the trace")
    busy, gaps = {}, {}
    for cmds in runs.values():
        prev_end = None
        for i, (kind, name, _size, _q, _s, start, end) in enumerate(cmds):
            if i >= a.skip:
                busy.setdefault((kind, name), []).append((end - start) / 1e3)
                if prev_end is not None and 0 <= (start - prev_end) / 1e3 <= a.max_gap_us:
                    gaps.setdefault((kind, name), []).append((start - prev_end) / 1e3)
            prev_end = end

    total = sum(sum(v) for v in busy.values())
    per = None
    if a.per:
        per = sum(len(v) for (kind, name), v in busy.items() if name == a.per)
        if not per:
            print(f"trace_summary: no command named {a.per!r} in the trace: no per-call column", file=sys.stderr)
            per = None
    rows = sorted(busy.items(), key=lambda kv: -sum(kv[1]))
    print(f"{'kind':8} {'name':44} {'count':>6} {'median us':>10} {'total ms':>9} {'share':>6} {'gap before, median us':>22}"
          + (f" {'per ' + a.per + ', ms':>28}" if per else ""))
    for (kind, name), v in rows:
        g = gaps.get((kind, name))
        gap = f"{statistics.median(g):.1f}" if g else "-"
        print(f"{kind:8} {name[:44]:44} {len(v):6d} {statistics.median(v):10.1f} {sum(v) / 1e3:9.2f} "
              f"{100 * sum(v) / total:5.1f}% {gap:>22}" + (f" {sum(v) / 1e3 / per:28.3f}" if per else ""))
    all_gaps = [x for v in gaps.values() for x in v]
    print(f"device busy {total / 1e3:.2f} ms over {sum(len(v) for v in busy.values())} commands; "
          f"gaps under {a.max_gap_us:g} us: {sum(all_gaps) / 1e3:.2f} ms in {len(all_gaps)}")
    if per:
        print(f"per call of {a.per}: busy {total / 1e3 / per:.3f} ms, gaps {sum(all_gaps) / 1e3 / per:.3f} ms "
              f"({per} calls)")


if __name__ == "__main__":
    main()
