#!/usr/bin/python3
"""Charts from clmla-bench and torch_baseline.py JSON rows (a JSON array per file, or one object
per line).

    /usr/bin/python3 bench/plot.py clmla.json torch.json --out docs/img

writes
  decode_latency.png  median latency of the decode phase against context length, one panel per
                      batch size, a line per device, path and cache dtype (log-log);
  roofline.png        every decode, layer and prefill row at its arithmetic intensity (FLOPs per
                      byte, as the README defines them) against its GFLOP/s, under each device's
                      measured roofline: min(peak GB/s x intensity, peak fp32 FMA GFLOP/s), with
                      CLBlast SGEMM's GFLOP/s as a dashed line;
and with --markdown FILE, tables of the run: peaks, every row, MLA against
MHA, and clmla against PyTorch on the same shapes.
"""
import argparse
import json
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402 (the backend must be chosen first)

PATH_COLORS = {"absorbed": "tab:blue", "decompressed": "tab:orange", "mha": "tab:red"}
DEVICE_MARKERS = ["o", "s", "^", "D", "v", "P", "X"]
PHASE_MARKERS = {"decode": "o", "layer": "s", "prefill": "^"}


def load_rows(paths):
    rows = []
    for path in paths:
        with open(path) as f:
            text = f.read().strip()
        if not text:
            continue
        if text.startswith("["):
            rows.extend(json.loads(text))
        else:
            rows.extend(json.loads(line) for line in text.splitlines() if line.strip())
    return rows


def weights(row):
    # rows written before the weights dtype existed, and rows without weights, are float32
    return row.get("weights_dtype") or "f32"


def device_label(row):
    return "torch-cpu" if row["device"] == "torch-cpu" else "clmla " + row["device"]


def decode_latency(rows, out):
    decode = [r for r in rows if r["phase"] == "decode" and r.get("median_ms")]
    if not decode:
        return None
    batches = sorted({r["batch"] for r in decode})
    devices = sorted({device_label(r) for r in decode})
    fig, axes = plt.subplots(1, len(batches), figsize=(4.2 * len(batches), 4.2), sharey=True, squeeze=False)
    for ax, batch in zip(axes[0], batches):
        series = {}
        for r in decode:
            if r["batch"] == batch:
                series.setdefault((device_label(r), r["path"], r["cache_dtype"]), []).append((r["ctx"], r["median_ms"]))
        for (device, path, dtype), points in sorted(series.items()):
            points.sort()
            ax.plot([p[0] for p in points], [p[1] for p in points],
                    color=PATH_COLORS.get(path, "gray"), marker=DEVICE_MARKERS[devices.index(device) % 7],
                    linestyle="-" if dtype == "f32" else "--", markersize=5, linewidth=1.3,
                    label="%s, %s, %s" % (device, path, dtype))
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_title("decode, batch %d" % batch, fontsize=10)
        ax.set_xlabel("context length (tokens)")
        ax.grid(True, which="both", alpha=0.3)
    axes[0][0].set_ylabel("median latency per step (ms)")
    handles, labels = axes[0][0].get_legend_handles_labels()
    for ax in axes[0][1:]:
        for h, l in zip(*ax.get_legend_handles_labels()):
            if l not in labels:
                handles.append(h)
                labels.append(l)
    fig.legend(handles, labels, loc="lower center", ncol=min(3, len(labels)), fontsize=7, frameon=False)
    fig.suptitle("%s: latent attention of one new token per sequence (lower is better)" % decode[0]["preset"], fontsize=11)
    fig.tight_layout(rect=(0, 0.06 + 0.035 * ((len(labels) + 2) // 3), 1, 1))
    path = os.path.join(out, "decode_latency.png")
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def roofline(rows, out):
    measured = [r for r in rows if r["phase"] in PHASE_MARKERS and r.get("gflops") and r.get("arithmetic_intensity")]
    if not measured:
        return None
    fig, ax = plt.subplots(figsize=(8.5, 6.2))
    # One roofline per OpenCL device that measured its peaks; torch rows carry the peaks of a
    # clmla-bench run on their machine (--peaks), drawn only when no OpenCL row has them.
    roofs = {}
    for torch_rows in (False, True):
        for r in rows:
            if r.get("peak_gbs") and r.get("peak_gflops") and (r["device"] == "torch-cpu") == torch_rows:
                key = r["device"] if not torch_rows else r.get("platform", "torch-cpu")
                roofs.setdefault(key, (r["peak_gbs"], r["peak_gflops"], r.get("peak_sgemm_gflops")))
        if roofs:
            break
    low = min(r["arithmetic_intensity"] for r in measured) / 2
    high = max(r["arithmetic_intensity"] for r in measured) * 2
    for i, (name, (gbs, gflops, sgemm)) in enumerate(sorted(roofs.items())):
        ridge = gflops / gbs
        xs = [low, min(max(ridge, low), high), high]
        ax.plot(xs, [min(gbs * x, gflops) for x in xs], color="black", linewidth=1.2, linestyle=["-", ":"][i % 2])
        ax.annotate("%s: read %.1f GB/s, fp32 FMA %.0f GFLOP/s" % (name, gbs, gflops),
                    (high, gflops), textcoords="offset points", xytext=(-4, 4), ha="right", fontsize=7)
        if sgemm:
            ax.axhline(sgemm, color="gray", linestyle="--", linewidth=1)
            ax.annotate("best SGEMM %.1f GFLOP/s" % sgemm, (low, sgemm), textcoords="offset points", xytext=(4, 3),
                        fontsize=7, color="gray")
    devices = sorted({device_label(r) for r in measured})
    seen = set()
    for r in measured:
        device = device_label(r)
        label = "%s: %s %s" % (device, r["phase"], r["path"])
        filled = device != "torch-cpu"
        color = PATH_COLORS.get(r["path"], "gray")
        ax.scatter(r["arithmetic_intensity"], r["gflops"], marker=PHASE_MARKERS[r["phase"]], s=30,
                   facecolors=color if filled else "none", edgecolors=color, linewidths=1.1,
                   label=None if label in seen else label)
        seen.add(label)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(low, high)
    top = max([r["gflops"] for r in measured] + [v[1] for v in roofs.values()])
    ax.set_ylim(top=top * 2.5)
    ax.set_xlabel("arithmetic intensity (FLOPs per byte of cache, weights, inputs and outputs)")
    ax.set_ylabel("achieved GFLOP/s")
    ax.set_title("Roofline: %s; filled = clmla on OpenCL, hollow = PyTorch (%s)" % (
        measured[0]["preset"], ", ".join(d for d in devices)), fontsize=9)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.12), ncol=2, frameon=False)
    fig.tight_layout()
    path = os.path.join(out, "roofline.png")
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def fmt(value, digits=1):
    if value is None:
        return "-"
    if isinstance(value, str):
        return value
    if abs(value) >= 100 or digits == 0:
        return "%.0f" % value
    return ("%%.%df" % digits) % value


def pct(value):
    return "-" if value is None else "%.0f%%" % (100 * value)


def markdown(rows, path):
    out = []
    peaks = [r for r in rows if r["phase"] == "peak"]
    if peaks:
        out += ["| device | peak | median ms | GB/s | GFLOP/s | first call ms | how |", "|---|---|---|---|---|---|---|"]
        for r in peaks:
            out.append("| %s | %s | %s | %s | %s | %s | %s |" % (
                r["device"], r["path"], fmt(r["median_ms"], 2), fmt(r.get("gbs")) if r["path"] == "read-bandwidth" else "-",
                fmt(r.get("gflops")) if r["path"] != "read-bandwidth" else "-", fmt(r["first_ms"], 1), r["note"]))
        out.append("")
    measured = [r for r in rows if r["phase"] in PHASE_MARKERS]
    for phase in ("decode", "layer", "prefill"):
        these = [r for r in measured if r["phase"] == phase]
        if not these:
            continue
        out += ["| device | path | weights | cache | batch | ctx | median ms (min - max) | first ms | tokens/s | GB/s "
                "| GFLOP/s | % peak GB/s | % peak FLOP/s | cache MiB | MHA MiB |",
                "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for r in these:
            out.append("| %s | %s | %s | %s | %d | %d | %s (%s - %s) | %s | %s | %s | %s | %s | %s | %s | %s |" % (
                device_label(r), r["path"], weights(r) if phase != "decode" else "-", r["cache_dtype"], r["batch"],
                r["ctx"], fmt(r["median_ms"], 2),
                fmt(r["min_ms"], 2), fmt(r["max_ms"], 2), fmt(r["first_ms"], 1), fmt(r.get("tokens_per_s"), 0),
                fmt(r.get("gbs"), 2), fmt(r.get("gflops")), pct(r.get("frac_peak_bw")), pct(r.get("frac_peak_flops")),
                fmt(r.get("cache_mib")), fmt(r.get("mha_cache_mib"))))
        out.append("")
    # MLA (absorbed) against MHA, per device and shape
    key = (lambda r: (device_label(r), r["cache_dtype"], r["batch"], r["ctx"]))
    decode = [r for r in measured if r["phase"] == "decode"]
    mha = {key(r): r for r in decode if r["path"] == "mha"}
    pairs = [(r, mha[key(r)]) for r in decode if r["path"] == "absorbed" and key(r) in mha]
    if pairs:
        out += ["| device | cache | batch | ctx | MLA absorbed ms | MHA ms | MHA / MLA time | MLA cache MiB "
                "| MHA cache MiB | memory ratio |", "|---|---|---|---|---|---|---|---|---|---|"]
        for a, m in pairs:
            out.append("| %s | %s | %d | %d | %s | %s | %.2fx | %s | %s | %.1fx |" % (
                device_label(a), a["cache_dtype"], a["batch"], a["ctx"], fmt(a["median_ms"], 2), fmt(m["median_ms"], 2),
                m["median_ms"] / a["median_ms"], fmt(a["cache_mib"]), fmt(m["cache_mib"]), m["cache_mib"] / a["cache_mib"]))
        out.append("")
    # clmla against torch on the same phase, path, dtype and shape
    shape = (lambda r: (r["phase"], r["path"], weights(r), r["cache_dtype"], r["batch"], r["ctx"]))
    torch_rows = {shape(r): r for r in measured if r["device"] == "torch-cpu"}
    versus = [(r, torch_rows[shape(r)]) for r in measured if r["device"] != "torch-cpu" and shape(r) in torch_rows]
    if versus:
        out += ["| phase | path | cache | batch | ctx | clmla ms | torch ms | torch / clmla time |",
                "|---|---|---|---|---|---|---|---|"]
        for c, t in versus:
            out.append("| %s | %s | %s | %d | %d | %s | %s | %.2fx |" % (
                c["phase"], c["path"], c["cache_dtype"], c["batch"], c["ctx"], fmt(c["median_ms"], 2),
                fmt(t["median_ms"], 2), t["median_ms"] / c["median_ms"]))
        out.append("")
    with open(path, "w") as f:
        f.write("\n".join(out))
    return path


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("json", nargs="+", help="clmla-bench --json or torch_baseline.py --json files")
    ap.add_argument("--out", default=".", help="directory for the PNG files (default: .)")
    ap.add_argument("--markdown", help="also write tables of the run (peaks, every row, MLA against MHA) to this file")
    a = ap.parse_args()
    rows = load_rows(a.json)
    if not rows:
        sys.exit("plot.py: no rows in %s" % ", ".join(a.json))
    os.makedirs(a.out, exist_ok=True)
    for path in (decode_latency(rows, a.out), roofline(rows, a.out)):
        if path:
            print("plot.py: wrote %s (%.0f KB)" % (path, os.path.getsize(path) / 1024))
    if a.markdown:
        print("plot.py: wrote %s" % markdown(rows, a.markdown))


if __name__ == "__main__":
    main()
