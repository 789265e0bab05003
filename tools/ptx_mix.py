#!/usr/bin/env python3
"""The instruction mix of each kernel in PTX: what a GPU's compiled kernels spend instructions on.

    python3 tools/ptx_mix.py PATH... [--entry REGEX]

PATH: a .ptx file, a .clbin file of clmla's program cache (its 32-byte header is skipped; on NVIDIA's
OpenCL the binary is PTX text), or a folder of either (tools/gpu-check.sh's ptx part writes one folder
per kernel variant). Binaries that are not PTX (PoCL's, AMD's) are skipped with a note.

For every `.entry` it counts the instructions of its body, statically (a loop body counts once, an
unrolled loop as often as it was unrolled), by class:
  fma     fma / mad on f32          f32     other f32 arithmetic (mul, add, sub, min, max, ...)
  cvt     conversions (cvt.*), by type pair in the detail line
  int     integer and bit arithmetic (add.s32, shl, shr, and, or, xor, lop3, prmt, bfe, bfi, mul.lo, ...)
  ldg     loads from global memory  lds / sts  loads from / stores to local (shared) memory
  other   the rest (branches, setp, selp, mov, barriers, ...)
and "extra/fma": every instruction that is not an FMA, per FMA. In a kernel bound by its issue rate,
as clmla's latent attention is on an H100, that ratio says how much the decoding of a cache or weight
dtype costs beside the FMAs it feeds; the detail line names the conversions, whose throughput on
NVIDIA GPUs is a fraction of the FMAs'.
"""
import argparse
import collections
import os
import re
import sys

HEADER = b"CLMLABIN"
HEADER_BYTES = 32

INSTR = re.compile(r"^\s*(?:@!?%\w+\s+)?([a-z][a-z0-9_.]*)")
F32_OPS = ("mul", "add", "sub", "min", "max", "neg", "abs", "div", "rcp", "sqrt", "rsqrt", "ex2", "lg2",
           "testp", "copysign")
INT_OPS = ("add", "sub", "mul", "mad", "shl", "shr", "and", "or", "xor", "not", "lop3", "prmt", "bfe", "bfi",
           "shf", "min", "max", "abs", "neg", "popc", "clz", "brev", "sad", "cnot")


def classify(op):
    """Class of a PTX opcode (rounding and other modifiers ignored)."""
    parts = op.split(".")
    base = parts[0]
    types = [p for p in parts[1:] if re.fullmatch(r"[bsuf]\d+|pred", p)]
    if base in ("fma", "mad") and "f32" in types:
        return "fma"
    if base == "cvt":
        return "cvt"
    if base in ("ld", "ldu"):
        return "lds" if "shared" in parts else "ldg" if "global" in parts else "other"
    if base == "st" and "shared" in parts:
        return "sts"
    if base in F32_OPS and "f32" in types:
        return "f32"
    if base in INT_OPS and types and not any(t.startswith("f") for t in types):
        return "int"
    return "other"


def ptx_text(path):
    """The PTX in a file, or None when it holds none."""
    with open(path, "rb") as f:
        data = f.read()
    if data.startswith(HEADER):
        data = data[HEADER_BYTES:]
    text = data.decode("utf-8", "replace")
    return text if ".entry" in text else None


def entries(text):
    """(name, [opcode, ...]) for every .entry of a PTX text."""
    out = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        m = re.match(r"^\s*(?:\.visible\s+)?\.entry\s+([\w$]+)", lines[i])
        if not m:
            i += 1
            continue
        name, depth, ops, started = m.group(1), 0, [], False
        i += 1
        while i < len(lines):
            line = lines[i].split("//")[0]
            if "{" in line:
                started = True
            depth += line.count("{") - line.count("}")
            i += 1
            if started and depth <= 0:
                break
            s = line.strip()
            if not s or s.startswith(".") or s.endswith(":") or s in ("{", "}"):
                continue
            mm = INSTR.match(s)
            if mm:
                ops.append(mm.group(1))
        out.append((name, ops))
    return out


def summarize(ops):
    counts = collections.Counter(classify(o) for o in ops)
    cvt = collections.Counter(".".join(p for p in o.split(".") if re.fullmatch(r"[bsuf]\d+", p))
                              for o in ops if o.startswith("cvt."))
    loads = collections.Counter(o for o in ops if classify(o) == "ldg")
    return counts, cvt, loads


def files_of(paths):
    for p in paths:
        if os.path.isdir(p):
            for name in sorted(os.listdir(p)):
                if name.endswith((".clbin", ".ptx")):
                    yield os.path.join(p, name)
        else:
            yield p


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("paths", nargs="+")
    ap.add_argument("--entry", default=None, help="only entries whose name matches this regex")
    args = ap.parse_args(argv)
    cols = ("fma", "f32", "cvt", "int", "ldg", "lds", "sts", "other")
    print(f"{'file':40s} {'entry':28s} {'instr':>6s} " + " ".join(f"{c:>6s}" for c in cols) + "  extra/fma")
    found = skipped = 0
    for path in files_of(args.paths):
        text = ptx_text(path)
        label = os.path.join(os.path.basename(os.path.dirname(path)), os.path.basename(path))[-40:]
        if text is None:
            skipped += 1
            continue
        for name, ops in entries(text):
            if args.entry and not re.search(args.entry, name):
                continue
            found += 1
            counts, cvt, loads = summarize(ops)
            n = len(ops)
            ratio = f"{(n - counts['fma']) / counts['fma']:.2f}" if counts["fma"] else "-"
            print(f"{label:40s} {name:28s} {n:6d} " + " ".join(f"{counts[c]:6d}" for c in cols) + f"  {ratio:>9s}")
            detail = []
            if cvt:
                detail.append("cvt " + ", ".join(f"{k} {v}" for k, v in cvt.most_common()))
            if loads:
                detail.append("global loads " + ", ".join(f"{k} {v}" for k, v in loads.most_common(4)))
            if detail:
                print(f"{'':40s}   " + "; ".join(detail))
    if skipped:
        print(f"({skipped} files hold no PTX: skipped)")
    if not found:
        print("no PTX entries found", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
