#!/usr/bin/env python3
"""Tables from a gpu-check folder (tools/gpu-check.sh's OUT, or its gpu-check.tar.gz unpacked): the
goals of issues 23 and 24 against the run's rows, the experimental parameters against their
baselines, the rest of the rows, and the layer step's kernels, as Markdown for docs/BENCHMARKS.md.

  python3 tools/gpu_report.py OUT

Medians in ms from clmla-bench's JSON rows; a ratio is variant / baseline (below 1: the variant is
faster) or, where named, one dtype's time over another's. Rows a run did not reach are left out.
Standard library only.
"""
import json
import os
import sys


def load(folder, name):
    path = os.path.join(folder, name)
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return json.load(f)


def key(row, fields):
    return tuple(row.get(f) for f in fields)


def table(header, rows):
    if not rows:
        return
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for r in rows:
        print("| " + " | ".join(str(c) for c in r) + " |")
    print()


def ms(v):
    return "-" if v is None else (f"{v:.3f}" if v < 10 else f"{v:.1f}")


def ratio(a, b):
    return "-" if a is None or b is None or b == 0 else f"{a / b:.2f}"


def pct(v):
    return "-" if v is None else f"{100 * v:.0f}%"


def by(rows, fields):
    return {key(r, fields): r for r in rows}


def device_line(folder):
    for name in sorted(os.listdir(folder)):
        if name.endswith(".json") and name not in ("devices.json",) and not name.startswith("kernel-tuning"):
            rows = load(folder, name)
            if rows and isinstance(rows, list) and "device" in rows[0]:
                r = rows[0]
                print(f"Device: {r['device']} ({r['vendor']}, {r['platform']}, driver {r['driver']}, "
                      f"{r['compute_units']} compute units), clmla {r['clmla_version']}.")
                break
    peaks = [r for r in load(folder, "peak.json") if r.get("phase") == "peak"]
    if peaks:
        p = peaks[0]
        def rate(g):
            return f"{g / 1e3:.1f} TFLOP/s" if g >= 1000 else f"{g:.0f} GFLOP/s"
        floor = [r for r in peaks if r.get("path") == "call-floor" and r.get("median_ms")]
        floor_text = f", a call's floor {floor[0]['median_ms'] * 1e3:.1f} us" if floor else ""
        print(f"Peaks: read {p.get('peak_gbs') or 0:.0f} GB/s, FP32 FMA {rate(p.get('peak_gflops') or 0)}, "
              f"SGEMM {rate(p.get('peak_sgemm_gflops') or 0)}{floor_text}.")
    print()


def decode_variants(folder, tag):
    """The latent decode variants a folder holds for a shape, {label: rows}: decode-TAG-dhN.json
    (group_decode_heads N), decode-TAG-msN.json (group_min_split_keys N), decode-TAG-stN.json
    (group_stage_keys N, with group_decode_heads 4), decode-TAG-laN.json (group_aligned N),
    decode-TAG-rsN.json (group_row_slices N, with group_min_split_keys 32)."""
    out = {}
    prefix = f"decode-{tag}-"
    for name in sorted(os.listdir(folder)):
        if not (name.startswith(prefix) and name.endswith(".json")):
            continue
        v = name[len(prefix):-5]
        for short, label, more in (("dh", "group_decode_heads", ""), ("ms", "group_min_split_keys", ""),
                                   ("st", "group_stage_keys", " (+dh 4)"), ("la", "group_aligned", ""),
                                   ("rs", "group_row_slices", " (+ms 32)")):
            if v.startswith(short) and v[len(short):].isdigit():
                out[f"{label} {v[len(short):]}{more}"] = load(folder, name)
    return out


def decode_ab(folder):
    fields = ("batch", "ctx", "cache_dtype")
    for tag, preset in (("v2lite", "v2-lite"), ("v3", "v3")):
        base = by([r for r in load(folder, f"decode-{tag}.json") if r.get("phase") == "decode"], fields)
        if not base:
            continue
        variants = {v: by(rows, fields) for v, rows in decode_variants(folder, tag).items()}
        if variants:
            print(f"**Latent decode variants at {preset}** (base = the parameters in force; ratio = "
                  f"variant / base; last column: that cache's time over f16's, base):")
        else:
            print(f"**Latent decode at {preset}, decoded caches** (last column: that cache's time over f16's):")
        print()
        rows = []
        for k in sorted(base, key=lambda k: (k[0], k[1], str(k[2]))):
            b = base[k]
            if k[2] == "f32" and not any(k in rows for rows in variants.values()):
                continue
            cells = [k[0], k[1], k[2], ms(b["median_ms"]), pct(b.get("of_bound"))]
            for v in variants:
                r = variants[v].get(k)
                cells += [ms(r["median_ms"]) if r else "-", ratio(r["median_ms"] if r else None, b["median_ms"])]
            f16 = base.get((k[0], k[1], "f16"))
            cells.append(ratio(b["median_ms"], f16["median_ms"] if f16 else None))
            rows.append(cells)
        header = ["batch", "ctx", "cache", "base: ms", "%bound"]
        for v in variants:
            header += [f"{v}: ms", f"{v} / base"]
        table(header + ["over f16"], rows)
        f32 = [base[k] for k in sorted(base) if k[2] == "f32"]
        table(["batch", "ctx", "f32 cache ms", "%bound", "bound by"],
              [[r["batch"], r["ctx"], ms(r["median_ms"]), pct(r.get("of_bound")), r.get("bound_by")] for r in f32])


# the layer step's and the products' variants of gpu-check.sh's ab part, by the name of their files
LAYER_VARIANTS = {"nn8": "skinny_nn_slices 8", "nn16": "skinny_nn_slices 16", "ms32": "group_min_split_keys 32",
                  "al4": "skinny_aligned 1", "al16": "skinny_aligned 1, skinny_vector 16",
                  "al0": "skinny_aligned 0"}


def nn_ab(folder):
    """The layer step with each variant the folder holds beside the parameters in force, and the
    product kernels' and the latent kernel's medians from each traced step."""
    fields = ("preset", "batch", "weights_dtype")
    runs = {v: by([r for n in (f"ab-layer-{v}.json", f"ab-layer-v3-{v}.json") for r in load(folder, n)
                   if r.get("phase") == "layer"], fields) for v in ["base"] + list(LAYER_VARIANTS)}
    names = {v: n for v, n in LAYER_VARIANTS.items() if runs[v]}
    if not runs["base"]:
        return
    print("**The layer step's variants** (ctx 4096, ms; ratio = variant / base): " +
          "; ".join(f"{v}: {n}" for v, n in names.items()))
    print()
    rows = []
    for k in sorted(runs["base"], key=lambda k: (k[0], k[1], str(k[2]))):
        b = runs["base"][k]["median_ms"]
        cells = [k[0], k[1], k[2], ms(b)]
        for v in names:
            r = runs[v].get(k)
            cells += [ms(r["median_ms"]) if r else "-", ratio(r["median_ms"] if r else None, b)]
        rows.append(cells)
    header = ["shape", "batch", "weights", "base ms"]
    for v in names:
        header += [f"{v} ms", f"{v} / base"]
    table(header, rows)
    rows = []
    for run in ("v2-lite-f32", "v3-fp8"):
        for kernel in ("gemm_skinny_nt", "gemm_skinny_nn", "attn_latent"):
            cells = [run, kernel]
            for v in ["base"] + list(names):
                path = os.path.join(folder, f"ab-trace-summary-{run}-{v}.txt")
                found = "-"
                if os.path.exists(path):
                    with open(path) as f:
                        for line in f:
                            parts = line.split()
                            if len(parts) > 3 and parts[0] == "kernel" and parts[1].startswith(kernel):
                                found = f"{parts[1]} {parts[3]} us"
                                break
                cells.append(found)
            rows.append(cells)
    print("The product kernels and the latent attention in the traced steps (median per call):")
    print()
    table(["step", "kernel", "base"] + list(names), rows)


def products_ab(folder):
    """Decode products with each variant beside the parameters in force (ab-products-PRESET-V.json)."""
    fields = ("path", "batch", "weights_dtype")
    for preset in ("v2-lite", "v3"):
        runs = {v: by([r for r in load(folder, f"ab-products-{preset}-{v}.json") if r.get("phase") == "products"],
                      fields) for v in ["base"] + list(LAYER_VARIANTS)}
        names = {v: n for v, n in LAYER_VARIANTS.items() if runs[v]}
        if not runs["base"] or not names:
            continue
        print(f"**{preset}'s products, variants** (ms; ratio = variant / base): " +
              "; ".join(f"{v}: {n}" for v, n in names.items()))
        print()
        rows = []
        for k in sorted(runs["base"], key=lambda k: (k[1], str(k[0]), str(k[2]))):
            b = runs["base"][k]
            cells = [k[0], k[1], k[2], f"{ms(b['median_ms'])} ({pct(b.get('of_bound'))})"]
            for v in names:
                r = runs[v].get(k)
                cells += [ms(r["median_ms"]) if r else "-", ratio(r["median_ms"] if r else None, b["median_ms"])]
            rows.append(cells)
        header = ["product", "rows", "weights", "base ms (%bound)"]
        for v in names:
            header += [f"{v} ms", f"{v} / base"]
        table(header, rows)


def prefill_ab(folder):
    fields = ("path", "ctx", "prefix", "weights_dtype")
    for base_name, var_name, what in (("prefill.json", "prefill-tiled.json", "prefill"),
                                      ("prefix.json", "prefix-tiled.json", "chunks after a prefix")):
        base = [r for r in load(folder, base_name) if r.get("phase") == "prefill"]
        if not base:
            continue
        tiled = by(load(folder, var_name), fields)
        both = by(base, fields)
        if tiled: # a folder of 2026-11-26, when attn_prefill was the default
            print(f"**{what}**: absorbed and decompressed (attn_prefill), and the decompressed path with "
                  f"prefill_tiled 1 (attn_prefill_tiled):")
        else:
            print(f"**{what}**: absorbed and decompressed (the kernels in force), ms:")
        print()
        rows = []
        seen = set()
        for r in base:
            k = (r.get("ctx"), r.get("prefix"), r.get("weights_dtype"))
            if k in seen:
                continue
            seen.add(k)
            a = both.get(("absorbed",) + k)
            d = both.get(("decompressed",) + k)
            t = tiled.get(("decompressed",) + k)
            cells = [k[0], k[1] or 0, k[2], ms(a["median_ms"]) if a else "-", ms(d["median_ms"]) if d else "-"]
            if tiled:
                cells += [ms(t["median_ms"]) if t else "-", ratio(t["median_ms"] if t else None,
                                                                   d["median_ms"] if d else None),
                          ratio(a["median_ms"] if a else None, t["median_ms"] if t else None)]
            else:
                cells.append(ratio(a["median_ms"] if a else None, d["median_ms"] if d else None))
            rows.append(cells)
        header = ["tokens", "prefix", "weights", "absorbed ms", "decompressed ms"]
        table(header + (["tiled ms", "tiled / decompressed", "absorbed / tiled"] if tiled else
                        ["absorbed / decompressed"]), rows)


def dtype_table(rows, first, title, header, cell, order=None):
    """A table a row per (rows' `first` field, batch): cell(row) of the f32, bf16 and fp8 runs, then
    the ratios f32 / bf16 and f32 / fp8 of their medians."""
    t = by(rows, (first, "batch", "weights_dtype"))
    print(title)
    print()
    out = []
    for name, batch in sorted({(r[first], r["batch"]) for r in rows}, key=order):
        f32, bf16, fp8 = (t.get((name, batch, w)) for w in ("f32", "bf16", "fp8"))
        cells = [name, batch] + [cell(r) for r in (f32, bf16, fp8)]
        cells += [ratio(f32["median_ms"] if f32 else None, r["median_ms"] if r else None) for r in (bf16, fp8)]
        out.append(cells)
    table(header, out)


def products(folder):
    rows = [r for r in load(folder, "products-v3.json") if r.get("phase") == "products"]
    if not rows:
        return
    dtype_table(rows, "path", "**V3's products** (ms, % of the bound; ratios f32 / dtype):",
                ["product", "rows", "f32", "bf16", "fp8", "f32 / bf16", "f32 / fp8"],
                lambda r: f"{ms(r['median_ms'])} ({pct(r.get('of_bound'))})" if r else "-",
                order=lambda x: (x[1], x[0]))


def layer(folder):
    rows = [r for name in ("layer.json", "layer-v3.json") for r in load(folder, name) if r.get("phase") == "layer"]
    if not rows:
        return
    dtype_table(rows, "preset", "**A layer's decode step** (ctx 4096; ratios f32 / dtype):",
                ["shape", "batch", "f32 ms", "bf16 ms", "fp8 ms", "f32 / bf16", "f32 / fp8"],
                lambda r: ms(r["median_ms"]) if r else "-")


def qlen(folder):
    for name, heads in (("qlen-16.json", 16), ("qlen-8.json", 8)):
        rows = [r for r in load(folder, name) if r.get("phase") == "decode"]
        if not rows:
            continue
        t = by(rows, ("batch", "q_len"))
        print(f"**Multi-token decode, {heads} heads, ctx 32768** (ms; ratio to one token):")
        print()
        out = []
        for batch in sorted({r["batch"] for r in rows}):
            one = t.get((batch, 1))
            for q in sorted({r["q_len"] for r in rows if r["batch"] == batch}):
                r = t[(batch, q)]
                out.append([batch, q, ms(r["median_ms"]), ratio(r["median_ms"], one["median_ms"] if one else None),
                            pct(r.get("of_bound"))])
        table(["batch", "tokens", "ms", "/ one token", "%bound"], out)


def mma_ab(folder):
    """attn_latent_mma (gpu-check's mma part) beside the parameters in force: its checks' errors
    (mma-check*.txt), then the timed pairs mma-decode-TAG-baseN / mma-decode-TAG-mmaN.json and
    mma-sparse-v3-base / mma-sparse-v3-mma.json."""
    checks = []
    for name in sorted(n for n in os.listdir(folder) if n.startswith("mma-check") and n.endswith(".txt")):
        errs = []
        with open(os.path.join(folder, name)) as f:
            for line in f:  # a row's note ends "...; check 3.1e-06"
                words = line.replace(";", " ").split()
                if line.startswith("decode") and "check" in words[:-1]:
                    w = words[words.index("check") + 1]
                    if _number(w):
                        errs.append(float(w))
        checks.append([name[:-4], len(errs), f"{max(errs):.1e}" if errs else "-"])
    if checks:
        print("**attn_latent_mma against float64** (clmla-bench --check; the largest error over each step's rows):")
        print()
        table(["step", "rows", "largest error"], checks)
    fields = ("batch", "ctx", "cache_dtype")
    pairs = []
    for tag, preset in (("v2lite", "v2-lite"), ("v3", "v3")):
        for n in (1, 2):
            pairs.append((f"{preset}, round {n}", f"mma-decode-{tag}-base{n}.json", f"mma-decode-{tag}-mma{n}.json"))
    pairs.append(("v3, sparse (topk 2048)", "mma-sparse-v3-base.json", "mma-sparse-v3-mma.json"))
    out = []
    for label, bn, mn in pairs:
        base = by([r for r in load(folder, bn) if r.get("phase") == "decode"], fields)
        mma = by([r for r in load(folder, mn) if r.get("phase") == "decode"], fields)
        for k in sorted(mma, key=lambda k: (k[0], k[1], str(k[2]))):
            b, m = base.get(k), mma[k]
            out.append([label, k[0], k[1], k[2], ms(b["median_ms"]) if b else "-", ms(m["median_ms"]),
                        ratio(m["median_ms"], b["median_ms"] if b else None), pct(m.get("of_bound"))])
    if out:
        print("**attn_latent_mma (group_mma 1) against the parameters in force** (ratio = mma / base):")
        print()
        table(["run", "batch", "ctx", "cache", "base ms", "mma ms", "mma / base", "mma %bound"], out)


def _number(w):
    try:
        float(w)
        return True
    except ValueError:
        return False


def traces(folder):
    names = sorted(n for n in os.listdir(folder) if n.startswith("trace-summary-") and n.endswith(".txt"))
    decode = sorted(n for n in os.listdir(folder) if n.startswith("ab-trace-summary-decode-") and n.endswith(".txt"))
    for n in names + decode:
        if n in decode:
            print(f"**{n[len('ab-trace-summary-decode-'):-4]}: latent decode's commands, batch 1, ctx 4096, bf16 "
                  f"cache** (CLMLA_TRACE):")
        else:
            print(f"**{n[len('trace-summary-'):-4]}: the layer step's commands** (CLMLA_TRACE):")
        print()
        print("```")
        with open(os.path.join(folder, n)) as f:
            print(f.read().rstrip())
        print("```")
        print()


def ptx_mix(folder):
    path = os.path.join(folder, "ptx-mix.txt")
    if os.path.exists(path):
        print("**The compiled kernels' instruction mix** (`ptx` part, tools/ptx_mix.py; one folder per variant):")
        print()
        print("```")
        with open(path) as f:
            print(f.read().rstrip())
        print("```")
        print()


def goals(folder):
    """Issues 23's and 24's GPU goals against this run's rows (the goals' texts: issues 23 and 24)."""
    out = []
    v3 = [r for r in load(folder, "decode-v3.json") if r.get("phase") == "decode" and r.get("cache_dtype") == "f32"]
    big = [r["of_bound"] for r in v3 if r["batch"] >= 8 and r["ctx"] >= 4096 and r.get("of_bound") is not None]
    if big:
        out.append(["24", "V3 latent decode, batch >= 8, ctx >= 4096: >= 60% of the bound",
                    f"{pct(min(big))} - {pct(max(big))}", "met" if min(big) >= 0.6 else "not met"])
    one = [r["of_bound"] for r in v3 if r["batch"] == 1 and r["ctx"] == 32768 and r.get("of_bound") is not None]
    if one:
        out.append(["24", "V3 latent decode, batch 1, ctx 32768: >= 50% of the bound", pct(one[0]),
                    "met" if one[0] >= 0.5 else "not met"])
    prods = [r for r in load(folder, "products-v3.json") if r.get("phase") == "products" and r["batch"] == 1]
    f32 = [r for r in prods if r["weights_dtype"] == "f32" and r.get("frac_peak_bw") is not None]
    if f32:
        lo, hi = min(r["frac_peak_bw"] for r in f32), max(r["frac_peak_bw"] for r in f32)
        out.append(["24", "V3 products, 1 row, f32: >= 60% of the read bandwidth", f"{pct(lo)} - {pct(hi)}",
                    "met" if lo >= 0.6 else "not met"])
    t = by(prods, ("path", "weights_dtype"))
    for w, goal in (("bf16", 1.7), ("fp8", 2.5)):
        ratios = [t[(p, "f32")]["median_ms"] / t[(p, w)]["median_ms"] for p, d in t if d == w and (p, "f32") in t]
        if ratios:
            out.append(["23", f"V3 products, 1 row: f32 / {w} >= {goal}x on every projection",
                        f"{min(ratios):.2f}x - {max(ratios):.2f}x", "met" if min(ratios) >= goal else "not met"])
    for tag in ("v2lite", "v3"):
        best = {}
        for rows in [load(folder, f"decode-{tag}.json")] + list(decode_variants(folder, tag).values()):
            for r in rows:
                if r.get("phase") == "decode" and r.get("cache_dtype") in ("f16", "fp8"):
                    k = (r["batch"], r["ctx"], r["cache_dtype"])
                    best[k] = min(best.get(k, float("inf")), r["median_ms"])
        ratios = [best[(b, c, "fp8")] / best[(b, c, "f16")] for (b, c, d) in best if d == "fp8" and (b, c, "f16") in best]
        if ratios:
            out.append(["23", f"{tag} latent decode: fp8 cache faster than f16 (the best of the variants run)",
                        f"fp8 / f16 {min(ratios):.2f} - {max(ratios):.2f}", "met" if max(ratios) < 1 else "not met"])
    layer = by([r for n in ("ab-layer-base.json", "ab-layer-v3-base.json", "layer.json", "layer-v3.json")
                for r in load(folder, n) if r.get("phase") == "layer"], ("preset", "batch", "weights_dtype"))
    for preset, w, goal in (("v2-lite", "bf16", 1.4), ("v3", "fp8", 1.8)):
        a, b = layer.get((preset, 1, "f32")), layer.get((preset, 1, w))
        if a and b:
            r = a["median_ms"] / b["median_ms"]
            out.append(["23", f"{preset} layer step, batch 1: {w} weights >= {goal}x f32", f"{r:.2f}x",
                        "met" if r >= goal else "not met"])
    if out:
        print("**Goals** (one run):")
        print()
        table(["issue", "goal", "this run", ""], out)


def main():
    if len(sys.argv) != 2 or not os.path.isdir(sys.argv[1]):
        sys.exit("usage: python3 tools/gpu_report.py OUT (a gpu-check folder)")
    folder = sys.argv[1]
    device_line(folder)
    goals(folder)
    nn_ab(folder)
    products_ab(folder)
    decode_ab(folder)
    prefill_ab(folder)
    products(folder)
    layer(folder)
    qlen(folder)
    mma_ab(folder)
    traces(folder)
    ptx_mix(folder)
    summary = os.path.join(folder, "summary.txt")
    if os.path.exists(summary):
        # each step's last word over the calls into the folder ("done by an earlier call" adds none)
        last = {}
        with open(summary) as f:
            for line in f:
                name, _, what = line.strip().partition(": ")
                if what and not line.startswith("==") and not what.startswith("done by"):
                    last[name] = what
        skipped = [n for n, w in last.items() if w.startswith("skipped")]
        failed = [f"{n} ({w.split(' in ')[0]})" for n, w in last.items() if w.startswith("exit") and not w.startswith("exit 0 ")]
        if skipped:
            print("Not reached within the budget: " + ", ".join(skipped) + ".")
        if failed:
            print("Stopped or failed (exit 124: stopped at the budget): " + ", ".join(failed) + ".")


if __name__ == "__main__":
    main()
