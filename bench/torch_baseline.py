#!/usr/bin/python3
"""The shapes clmla-bench measures, in PyTorch on the CPU: what one would otherwise run.

Written from the project's MLA notes (docs/MLA.md): DeepSeek's absorbed formulation (W^UK folded into
the query, attention over the latent cache c^KV and the shared k^R, W^UV after the weighted sum)
and the decompressed one (k^C, v^C up-projected from c^KV, ordinary attention with head dims
dq / dv), plus standard multi-head attention over a full per-head K/V cache ("mha", decode only).

Phases and byte / FLOP counts are those of clmla-bench (bench/counts.c, docs/BENCHMARKS.md), and
the rows use its JSON schema with device "torch-cpu", so bench/plot.py draws both side by side.
An f16 cache is stored as float16 and converted to float32 inside every timed step (PyTorch's CPU
matmuls do not take float16). Runs with Debian's python3-torch:

    /usr/bin/python3 bench/torch_baseline.py --phase decode --ctx 1024,4096 --batch 1,8 --json torch.json
"""
import argparse
import json
import math
import os
import statistics
import sys
import time

# torch runs its own OpenMP threads around each BLAS call; a multithreaded OpenBLAS inside them
# oversubscribes the cores (measured: 1.5-2x slower on 2 cores). Must be set before torch loads.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
import torch  # noqa: E402

# docs/MLA.md section 7: D, H, rq, rkv, dn, dr, dv, theta, YaRN (factor, L, beta_fast, beta_slow,
# mscale, mscale_all_dim).
PRESETS = {
    "v2-lite": dict(D=2048, H=16, rq=0, rkv=512, dn=128, dr=64, dv=128, theta=1e4,
                    yarn=(40, 4096, 32, 1, 0.707, 0.707)),
    "v2": dict(D=5120, H=128, rq=1536, rkv=512, dn=128, dr=64, dv=128, theta=1e4,
               yarn=(40, 4096, 32, 1, 0.707, 0.707)),
    "v3": dict(D=7168, H=128, rq=1536, rkv=512, dn=128, dr=64, dv=128, theta=1e4,
               yarn=(40, 4096, 32, 1, 1.0, 1.0)),
    "kimi-k2": dict(D=7168, H=64, rq=1536, rkv=512, dn=128, dr=64, dv=128, theta=5e4,
                    yarn=(32, 4096, 1, 1, 1.0, 1.0)),
}
DIM_OPTIONS = [("hidden", "D"), ("heads", "H"), ("q-lora-rank", "rq"), ("kv-lora-rank", "rkv"),
               ("nope-dim", "dn"), ("rope-dim", "dr"), ("v-dim", "dv")]
EPS = 1e-6
BLAS = "unknown BLAS"


# ---- the model -----------------------------------------------------------------------------

def yarn_mscale(s, m):
    return 1.0 if s <= 1 else 0.1 * m * math.log(s) + 1.0


def softmax_scale(cfg):
    """tau of docs/MLA.md section 4."""
    s, _, _, _, _, m_all = cfg["yarn"]
    return (cfg["dn"] + cfg["dr"]) ** -0.5 * yarn_mscale(s, m_all) ** 2


def rope_tables(cfg, positions):
    """(A cos, A sin) [len(positions), dr/2] of docs/MLA.md section 3, YaRN included."""
    dr, theta = cfg["dr"], cfg["theta"]
    s, L, beta_fast, beta_slow, mscale, mscale_all = cfg["yarn"]
    i = torch.arange(dr // 2, dtype=torch.float64)
    inv_freq = theta ** (-2 * i / dr)
    attenuation = 1.0
    if s > 1:
        def correction_dim(r):
            return dr * math.log(L / (2 * math.pi * r)) / (2 * math.log(theta))
        low = max(math.floor(correction_dim(beta_fast)), 0)
        high = min(math.ceil(correction_dim(beta_slow)), dr - 1)
        if low == high:
            high += 0.001
        ramp = ((i - low) / (high - low)).clamp(0, 1)
        inv_freq = inv_freq * (1 - ramp + ramp / s)
        attenuation = yarn_mscale(s, mscale) / yarn_mscale(s, mscale_all)
    angles = torch.as_tensor(positions, dtype=torch.float64)[:, None] * inv_freq[None, :]
    return (attenuation * angles.cos()).float(), (attenuation * angles.sin()).float()


def rope(x, cos, sin):
    """Interleaved pairs (x[2i], x[2i+1]); x [..., T, (heads,) dr], cos/sin [T, dr/2]."""
    while cos.dim() < x.dim() - 1:
        cos, sin = cos.unsqueeze(-2), sin.unsqueeze(-2)
    even, odd = x[..., 0::2], x[..., 1::2]
    return torch.stack((even * cos - odd * sin, even * sin + odd * cos), dim=-1).flatten(-2)


def rms_norm(x, weight):
    return weight * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS)


class Layer:
    """One attention layer's weights in the checkpoint layout of docs/MLA.md section 1, random."""

    def __init__(self, cfg, gen):
        D, H, rq, rkv, dn, dr, dv = (cfg[k] for k in ("D", "H", "rq", "rkv", "dn", "dr", "dv"))
        dq = dn + dr

        def uniform(*shape, fan_in):
            return (torch.rand(*shape, generator=gen) * 2 - 1) / math.sqrt(fan_in)

        if rq:
            self.q_a = uniform(rq, D, fan_in=D)
            self.q_a_norm = 1 + 0.1 * (torch.rand(rq, generator=gen) * 2 - 1)
            self.q_b = uniform(H * dq, rq, fan_in=rq)
        else:
            self.q = uniform(H * dq, D, fan_in=D)
        self.kv_a = uniform(rkv + dr, D, fan_in=D)
        self.kv_norm = 1 + 0.1 * (torch.rand(rkv, generator=gen) * 2 - 1)
        self.kv_b = uniform(H * (dn + dv), rkv, fan_in=rkv)
        self.o = uniform(D, H * dv, fan_in=H * dv)
        kv_b = self.kv_b.view(H, dn + dv, rkv)
        self.w_uk = kv_b[:, :dn]   # [H, dn, rkv]
        self.w_uv = kv_b[:, dn:]   # [H, dv, rkv]
        self.cfg = cfg
        self.tau = softmax_scale(cfg)

    def project(self, x, cos, sin):
        """x [B, T, D] -> q_nope [B, T, H, dn], q_rope [B, T, H, dr], c^KV [B, T, rkv], k^R [B, T, dr]."""
        c = self.cfg
        q = rms_norm(x @ self.q_a.T, self.q_a_norm) @ self.q_b.T if c["rq"] else x @ self.q.T
        q = q.view(*x.shape[:-1], c["H"], c["dn"] + c["dr"])
        kv = x @ self.kv_a.T
        c_kv = rms_norm(kv[..., :c["rkv"]], self.kv_norm)
        k_rope = rope(kv[..., c["rkv"]:], cos, sin)
        return q[..., :c["dn"]], rope(q[..., c["dn"]:], cos, sin), c_kv, k_rope

    def attend(self, path, q_nope, q_rope, c_kv, k_rope, causal_offset=None):
        """Queries [B, S, H, *] against keys [B, T, *]; causal_offset: query s sees keys <= s + offset.
        Returns o [B, S, H, dv]."""
        c = self.cfg
        if path == "absorbed":
            q_lat = torch.einsum("bshd,hdc->bshc", q_nope, self.w_uk)
            scores = (torch.einsum("bshc,btc->bsht", q_lat, c_kv) +
                      torch.einsum("bshr,btr->bsht", q_rope, k_rope)) * self.tau
        else:
            kv = (c_kv @ self.kv_b.T).view(*c_kv.shape[:-1], c["H"], c["dn"] + c["dv"])
            k_nope, v = kv[..., :c["dn"]], kv[..., c["dn"]:]
            scores = (torch.einsum("bshd,bthd->bsht", q_nope, k_nope) +
                      torch.einsum("bshr,btr->bsht", q_rope, k_rope)) * self.tau
        if causal_offset is not None:
            S, T = scores.shape[1], scores.shape[3]
            mask = torch.arange(T)[None, :] > (torch.arange(S)[:, None] + causal_offset)
            scores = scores.masked_fill(mask[None, :, None, :], float("-inf"))
        p = torch.softmax(scores, dim=-1)
        if path == "absorbed":
            return torch.einsum("bshc,hdc->bshd", torch.einsum("bsht,btc->bshc", p, c_kv), self.w_uv)
        return torch.einsum("bsht,bthd->bshd", p, v)


# ---- byte and FLOP counts: the formulas of bench/counts.c ---------------------------------------

def weight_bytes(c):
    dq = c["dn"] + c["dr"]
    q = c["rq"] * c["D"] + c["rq"] + c["H"] * dq * c["rq"] if c["rq"] else c["H"] * dq * c["D"]
    return 4.0 * (q + (c["rkv"] + c["dr"]) * c["D"] + c["rkv"] + c["H"] * (c["dn"] + c["dv"]) * c["rkv"] +
                  c["D"] * c["H"] * c["dv"])


def projection_flops(c, absorbed):
    dq = c["dn"] + c["dr"]
    f = (2 * (c["D"] * c["rq"] + c["rq"] * c["H"] * dq) if c["rq"] else 2 * c["D"] * c["H"] * dq)
    f += 2 * c["D"] * (c["rkv"] + c["dr"]) + 2 * c["H"] * c["dv"] * c["D"]
    if absorbed:
        f += 2 * c["H"] * c["dn"] * c["rkv"] + 2 * c["H"] * c["rkv"] * c["dv"]
    return f


def pair_flops(c, absorbed):
    return 2 * c["H"] * (2 * c["rkv"] + c["dr"]) if absorbed else 2 * c["H"] * (c["dn"] + c["dr"] + c["dv"])


def upproject_flops(c):
    return 2 * c["rkv"] * c["H"] * (c["dn"] + c["dv"])


def mla_cache_bytes(c, batch, ctx, elem):
    return batch * ctx * (c["rkv"] + c["dr"]) * elem


def mha_cache_bytes(c, batch, ctx, elem):
    return batch * ctx * c["H"] * (c["dn"] + c["dr"] + c["dv"]) * elem


# ---- the cases: each returns (step, counts) ------------------------------------------------------

def store(x, f16):
    return x.half() if f16 else x


def load(x):
    return x.float() if x.dtype == torch.float16 else x


def decode_case(cfg, path, B, ctx, f16, gen):
    H, rkv, dr, dn, dv = cfg["H"], cfg["rkv"], cfg["dr"], cfg["dn"], cfg["dv"]
    dq, row, elem = dn + dr, rkv + dr, 2 if f16 else 4
    tau = softmax_scale(cfg)

    def rand(*shape, scale=1.0):
        return (torch.rand(*shape, generator=gen) * 2 - 1) * scale

    counts = dict(tokens=B, mha_cache_bytes=mha_cache_bytes(cfg, B, ctx, elem))
    if path == "absorbed":
        # q~ = W^UK^T q^C and q^R per head against the latent cache [c^KV ; k^R]
        c_kv, k_rope = store(rand(B, ctx, rkv), f16), store(rand(B, ctx, dr), f16)
        q_lat, q_rope = rand(B, H, rkv), rand(B, H, dr)

        def step():
            c, k = load(c_kv), load(k_rope)
            scores = (torch.matmul(q_lat, c.transpose(1, 2)) + torch.matmul(q_rope, k.transpose(1, 2))) * tau
            return torch.matmul(torch.softmax(scores, dim=-1), c)  # [B, H, rkv]
        counts.update(flops=B * ctx * pair_flops(cfg, True), cache_bytes=mla_cache_bytes(cfg, B, ctx, elem))
        counts["bytes"] = counts["cache_bytes"] + B * H * row * 4 + B * H * rkv * 4
    elif path == "decompressed":
        c_kv, k_rope = store(rand(B, ctx, rkv), f16), store(rand(B, ctx, dr), f16)
        kv_b = rand(H * (dn + dv), rkv, scale=1 / math.sqrt(rkv))
        q = rand(B, H, dq)

        def step():
            c, k = load(c_kv), load(k_rope)
            kv = (c @ kv_b.T).view(B, ctx, H, dn + dv)
            scores = (torch.einsum("bhd,bthd->bht", q[..., :dn], kv[..., :dn]) +
                      torch.matmul(q[..., dn:], k.transpose(1, 2))) * tau
            return torch.einsum("bht,bthd->bhd", torch.softmax(scores, dim=-1), kv[..., dn:])
        counts.update(flops=B * ctx * (upproject_flops(cfg) + pair_flops(cfg, False)),
                      cache_bytes=mla_cache_bytes(cfg, B, ctx, elem))
        counts["bytes"] = counts["cache_bytes"] + H * (dn + dv) * rkv * 4 + B * H * dq * 4 + B * H * dv * 4
    else:  # mha: K [B, H, ctx, dq], V [B, H, ctx, dv]
        K, V = store(rand(B, H, ctx, dq), f16), store(rand(B, H, ctx, dv), f16)
        q = rand(B, H, 1, dq)

        def step():
            scores = torch.matmul(q, load(K).transpose(-1, -2)) * tau
            return torch.matmul(torch.softmax(scores, dim=-1), load(V))  # [B, H, 1, dv]
        counts.update(flops=B * ctx * pair_flops(cfg, False), cache_bytes=mha_cache_bytes(cfg, B, ctx, elem))
        counts["bytes"] = counts["cache_bytes"] + B * H * dq * 4 + B * H * dv * 4
    return step, counts


def layer_case(cfg, phase, path, B, ctx, f16, gen):
    """layer: one new token per sequence at position ctx over ctx cached tokens (the slot is
    rewritten every step, so the context stays ctx + 1); prefill: ctx prompt tokens."""
    layer = Layer(cfg, gen)
    rkv, dr, D, elem = cfg["rkv"], cfg["dr"], cfg["D"], 2 if f16 else 4
    prefill = phase == "prefill"
    n_new = ctx if prefill else 1
    keys = ctx if prefill else ctx + 1
    cache_c = store(torch.rand(B, keys, rkv, generator=gen) * 2 - 1, f16)
    cache_k = store(torch.rand(B, keys, dr, generator=gen) * 2 - 1, f16)
    x = torch.rand(B, n_new, D, generator=gen) * 2 - 1
    positions = list(range(ctx)) if prefill else [ctx]
    cos, sin = rope_tables(cfg, positions)
    # bound the score matrix of a prefill to about 256 MiB by taking the queries in chunks
    chunk = max(1, min(n_new, (256 << 20) // max(1, 4 * B * cfg["H"] * keys)))

    def step():
        q_nope, q_rope, c_kv, k_rope = layer.project(x, cos, sin)
        first = keys - n_new
        cache_c[:, first:] = c_kv.to(cache_c.dtype)
        cache_k[:, first:] = k_rope.to(cache_k.dtype)
        c_all, k_all = load(cache_c), load(cache_k)
        outs = []
        for s0 in range(0, n_new, chunk):
            s1 = min(n_new, s0 + chunk)
            outs.append(layer.attend(path, q_nope[:, s0:s1], q_rope[:, s0:s1], c_all, k_all,
                                     causal_offset=first + s0))
        o = torch.cat(outs, dim=1) if len(outs) > 1 else outs[0]
        return o.reshape(B, n_new, -1) @ layer.o.T

    absorbed = path == "absorbed"
    pairs = ctx * (ctx + 1) / 2 if prefill else keys
    counts = dict(tokens=B * n_new,
                  flops=B * (n_new * projection_flops(cfg, absorbed) + pairs * pair_flops(cfg, absorbed) +
                             (0 if absorbed else keys * upproject_flops(cfg))),
                  bytes=weight_bytes(cfg) + B * ((ctx if prefill else keys + 1) * (rkv + dr) * elem) +
                  2.0 * B * n_new * D * 4,
                  cache_bytes=mla_cache_bytes(cfg, B, keys, elem),
                  mha_cache_bytes=mha_cache_bytes(cfg, B, keys, elem))
    return step, counts


def memory_estimate(cfg, phase, path, B, ctx, f16):
    elem = 2 if f16 else 4
    H, dn, dv = cfg["H"], cfg["dn"], cfg["dv"]
    if phase == "decode":
        if path == "mha":
            return mha_cache_bytes(cfg, B, ctx, elem) * (1 + (2 if f16 else 0))
        up = B * ctx * H * (dn + dv) * 4 if path == "decompressed" else 0
        return mla_cache_bytes(cfg, B, ctx, elem) * (1 + (2 if f16 else 0)) + up + B * H * ctx * 8
    n = ctx if phase == "prefill" else 1
    up = B * (ctx + 1) * H * (dn + dv) * 4 if path != "absorbed" else 0
    return weight_bytes(cfg) + mla_cache_bytes(cfg, B, ctx + 1, 4) * 2 + up + B * n * cfg["D"] * 16 + (256 << 20)


# ---- timing: the loop of bench/timing.c, by wall clock ------------------------------------------

def last_level_cache_bytes():
    best = 0
    base = "/sys/devices/system/cpu/cpu0/cache"
    try:
        entries = os.listdir(base)
    except OSError:
        return 0
    for index in entries:
        try:
            with open(os.path.join(base, index, "size")) as f:
                text = f.read().strip()
            scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
            best = max(best, int(text.rstrip("KMG")) * scale)
        except (OSError, ValueError):
            continue
    return best


class Flush:
    """Writes 4x the last-level cache (at least 64 MiB) before every timed call, untimed, as
    clmla-bench does by default, so that inputs that fit in the cache are not read from it."""

    def __init__(self):
        self.buffer = torch.empty(max(4 * last_level_cache_bytes(), 64 << 20) // 4, dtype=torch.int32)
        self.generation = 0

    def __call__(self):
        self.generation += 1
        self.buffer.fill_(self.generation)


def time_step(step, quick, max_seconds, flush):
    min_samples, min_seconds, stable_fraction = 5, (0.1 if quick else 0.4), 0.02
    max_seconds = max_seconds or (0.6 if quick else 3.0)

    def sample(k):
        if flush:
            flush()
        t0 = time.perf_counter()
        for _ in range(k):
            step()
        return (time.perf_counter() - t0) * 1e3 / k

    first_ms = sample(1)
    warm_ms = sample(1)
    k = 1 if flush else max(1, min(64, math.ceil(2.0 / max(warm_ms, 1e-3))))
    if warm_ms > 500:
        min_samples = 3
    samples, stable, start = [], False, time.perf_counter()
    while len(samples) < 400:
        samples.append(sample(k))
        elapsed = time.perf_counter() - start
        if len(samples) >= min_samples and elapsed >= min_seconds:
            everything = statistics.median(samples)
            first_half = statistics.median(samples[:(len(samples) + 1) // 2])
            if abs(everything - first_half) <= stable_fraction * everything:
                stable = True
                break
        if len(samples) >= min_samples and elapsed >= max_seconds:
            break
    return dict(first_ms=first_ms, median_ms=statistics.median(samples), min_ms=min(samples), max_ms=max(samples),
                wall_median_ms=statistics.median(samples), samples=len(samples), calls_per_sample=k, stable=stable,
                cold_cache=flush is not None)


# ---- output -------------------------------------------------------------------------------------

def cpu_vendor_and_model():
    vendor, model = "unknown", "cpu"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() == "vendor_id":
                    vendor = value.strip()
                elif key.strip() == "model name":
                    model = value.strip()
                if vendor != "unknown" and model != "cpu":
                    break
    except OSError:
        pass
    return vendor, model


def blas_library():
    """The BLAS this process loaded (Debian's torch calls whatever libblas.so.3 resolves to: the
    slow reference implementation unless OpenBLAS is installed or on LD_LIBRARY_PATH)."""
    torch.ones(8, 8) @ torch.ones(8, 8)
    try:
        with open("/proc/self/maps") as f:
            libs = {line.split()[-1] for line in f if "blas" in line or "mkl" in line}
    except OSError:
        return "unknown BLAS"
    for lib in sorted(libs):
        if "openblas" in lib:
            return "OpenBLAS"
        if "mkl" in lib:
            return "MKL"
    for lib in sorted(libs):
        if "libblas.so" in lib:
            resolved = os.path.realpath(lib)
            return "OpenBLAS" if "openblas" in resolved else "reference BLAS" if "/blas/" in resolved else resolved
    return "unknown BLAS"


def bound(nbytes, flops, peak_gbs, peak_gflops, median_ms):
    """The roofline's time for a row, as clmla-bench's bench/report.c has it: max(bytes / read peak,
    FLOPs / FMA peak) in ms, which term is larger, and the fraction of it reached (bound / median);
    None where a count lacks its peak."""
    if (nbytes > 0 and not peak_gbs) or (flops > 0 and not peak_gflops) or (nbytes <= 0 and flops <= 0):
        return dict(bound_ms=None, bound_by=None, of_bound=None)
    bw_ms = nbytes / (peak_gbs * 1e6) if nbytes > 0 else 0.0
    flops_ms = flops / (peak_gflops * 1e6) if flops > 0 else 0.0
    ms = max(bw_ms, flops_ms)
    return dict(bound_ms=ms, bound_by="bw" if bw_ms >= flops_ms else "flops", of_bound=ms / median_ms)


def make_row(cfg, preset, phase, path, B, ctx, dtype, t, counts, peaks, note):
    vendor, model = cpu_vendor_and_model()
    seconds = t["median_ms"] * 1e-3
    gbs = counts["bytes"] / seconds * 1e-9
    gflops = counts["flops"] / seconds * 1e-9
    peak_gbs, peak_gflops, peak_sgemm = (peaks.get(k) for k in ("read", "fma", "sgemm"))
    row = dict(device="torch-cpu", vendor=vendor, driver="torch %s, %s, OPENBLAS_NUM_THREADS=%s, %d threads" % (
                   torch.__version__, BLAS, os.environ.get("OPENBLAS_NUM_THREADS"), torch.get_num_threads()),
               platform="PyTorch on " + model, compute_units=torch.get_num_threads(), clmla_version=None,
               preset=preset, phase=phase, path=path, batch=B, ctx=ctx, cache_dtype=dtype,
               hidden_size=cfg["D"], num_heads=cfg["H"], q_lora_rank=cfg["rq"], kv_lora_rank=cfg["rkv"],
               qk_nope_head_dim=cfg["dn"], qk_rope_head_dim=cfg["dr"], v_head_dim=cfg["dv"], timer="wall")
    row.update(t)
    row.update(tokens_per_s=counts["tokens"] / seconds, bytes=counts["bytes"], flops=counts["flops"], gbs=gbs,
               gflops=gflops, arithmetic_intensity=counts["flops"] / counts["bytes"],
               peak_gbs=peak_gbs, peak_gflops=peak_gflops, peak_sgemm_gflops=peak_sgemm,
               frac_peak_bw=gbs / peak_gbs if peak_gbs else None,
               frac_peak_flops=gflops / peak_gflops if peak_gflops else None,
               peaks_source="file" if peak_gbs or peak_gflops else None,
               **bound(counts["bytes"], counts["flops"], peak_gbs, peak_gflops, t["median_ms"]),
               cache_mib=counts["cache_bytes"] / 2 ** 20, mha_cache_mib=counts["mha_cache_bytes"] / 2 ** 20,
               check_rel_error=None, note=note)
    return row


def print_row(row):
    fraction = (lambda v: "%.0f%%" % (100 * v) if v else "-")
    print("%-7s %-14s %-5s %5d %6d %9.2f %9.3f (%.3f - %.3f) %10.0f %9.2f %9.2f %5s %5s %10.1f %10.1f  %s" % (
        row["phase"], row["path"], row["cache_dtype"], row["batch"], row["ctx"], row["first_ms"], row["median_ms"],
        row["min_ms"], row["max_ms"], row["tokens_per_s"], row["gbs"], row["gflops"], fraction(row["frac_peak_bw"]),
        fraction(row["frac_peak_flops"]), row["cache_mib"], row["mha_cache_mib"],
        row["note"] + ("" if row["stable"] else ("; " if row["note"] else "") + "not stable")), flush=True)


def read_peaks(path):
    """The peak rows of a clmla-bench JSON file measured on the same machine."""
    peaks = {}
    with open(path) as f:
        for row in json.load(f):
            if row.get("phase") == "peak" and row.get("median_ms"):
                # the SGEMM peak is the better of CLBlast ("sgemm") and clmla's own product ("sgemm-clmla")
                key = {"read-bandwidth": "read", "fp32-fma": "fma", "sgemm": "sgemm", "sgemm-clmla": "sgemm"}.get(row["path"])
                value = row.get("gbs") if key == "read" else row.get("gflops")
                if key and value and value > peaks.get(key, 0):
                    peaks[key] = value
    return peaks


def parse_list(text, kind, allowed=None):
    values = [kind(v) for v in text.split(",") if v]
    for v in values:
        if allowed and v not in allowed:
            raise SystemExit("torch_baseline: '%s' is not one of %s" % (v, ", ".join(allowed)))
        if kind is int and v < 1:
            raise SystemExit("torch_baseline: sizes must be positive")
    return values


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--preset", default="v2-lite", choices=sorted(PRESETS) + ["custom"])
    for name, _ in DIM_OPTIONS:
        ap.add_argument("--" + name, type=int)
    ap.add_argument("--phase", default=None, help="decode,layer,prefill (default decode; --quick: all three)")
    ap.add_argument("--ctx", help="context lengths (decode 1024,4096,32768; layer 4096; prefill 512,4096)")
    ap.add_argument("--batch", help="sequences per step (decode 1,8,32; layer and prefill 1)")
    ap.add_argument("--path", help="absorbed,decompressed,mha (decode absorbed,decompressed,mha; "
                                   "layer absorbed,decompressed; prefill decompressed)")
    ap.add_argument("--cache-dtype", default="f32", help="f32,f16")
    ap.add_argument("--threads", type=int, default=os.cpu_count(), help="torch.set_num_threads (default: all cores)")
    ap.add_argument("--max-mem", type=float, default=None, help="skip rows needing more MiB (default: half the RAM)")
    ap.add_argument("--max-time", type=float, default=None, help="stop sampling a row after this many seconds")
    ap.add_argument("--peaks", help="a clmla-bench JSON file whose peak rows (same machine) give the fractions")
    ap.add_argument("--json", help="write the rows to this file as a JSON array")
    ap.add_argument("--quick", action="store_true", help="small sweep, short timing")
    ap.add_argument("--warm-cache", action="store_true", help="do not flush the caches before each timed call")
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()

    torch.set_num_threads(a.threads)
    global BLAS
    BLAS = blas_library()
    if BLAS == "reference BLAS":
        print("torch_baseline: torch runs on Debian's reference BLAS, 10-50x slower than OpenBLAS: install "
              "libopenblas0 (or put /usr/lib/x86_64-linux-gnu/openblas-pthread on LD_LIBRARY_PATH)", file=sys.stderr)
    torch.set_grad_enabled(False)
    gen = torch.Generator().manual_seed(a.seed)
    cfg = dict(PRESETS["v2-lite" if a.preset == "custom" else a.preset])
    preset = a.preset
    for name, key in DIM_OPTIONS:
        value = getattr(a, name.replace("-", "_"))
        if value is not None and value != cfg[key]:
            cfg[key], preset = value, "custom"
    peaks = read_peaks(a.peaks) if a.peaks else {}
    flush = None if a.warm_cache else Flush()
    if a.max_mem:
        budget = a.max_mem * 2 ** 20
    else:
        budget = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2
    phases = parse_list(a.phase or ("decode,layer,prefill" if a.quick else "decode"), str, ("decode", "layer", "prefill"))
    dtypes = parse_list(a.cache_dtype, str, ("f32", "f16"))

    print("torch_baseline: PyTorch %s (%s) on %s, %d threads" % (torch.__version__, BLAS, cpu_vendor_and_model()[1],
                                                                torch.get_num_threads()))
    print("timing   wall clock; %s" % ("caches flushed before every call (%.0f MiB written)" % (
        flush.buffer.numel() * 4 / 2 ** 20) if flush else "warm caches (--warm-cache)"))
    print("model    %s: D %d, %d heads, q_lora_rank %d, kv_lora_rank %d, head dims nope/rope/v %d/%d/%d, "
          "softmax scale %.6f" % (preset, cfg["D"], cfg["H"], cfg["rq"], cfg["rkv"], cfg["dn"], cfg["dr"], cfg["dv"],
                                  softmax_scale(cfg)))
    print("\n%-7s %-14s %-5s %5s %6s %9s %9s %-21s %10s %9s %9s %5s %5s %10s %10s  %s" % (
        "phase", "path", "dtype", "batch", "ctx", "first ms", "median ms", "(min - max)", "tokens/s", "GB/s",
        "GFLOP/s", "%bw", "%flop", "cache MiB", "MHA MiB", "note"))
    rows = []
    for phase in phases:
        decode = phase == "decode"
        ctxs = parse_list(a.ctx or (("1024,4096" if a.quick else "1024,4096,32768") if decode else
                                    ("1024" if a.quick else "4096") if phase == "layer" else
                                    ("256" if a.quick else "512,4096")), int)
        batches = parse_list(a.batch or (("1,4" if a.quick else "1,8,32") if decode else "1"), int)
        paths = parse_list(a.path or ("absorbed,decompressed,mha" if decode else
                                      "absorbed,decompressed" if phase == "layer" else "decompressed"),
                           str, ("absorbed", "decompressed", "mha"))
        for dtype in dtypes:
            for path in paths:
                for B in batches:
                    for ctx in ctxs:
                        f16 = dtype == "f16"
                        if path == "mha" and not decode:
                            print("%-7s %-14s %-5s %5d %6d  skipped: mha is a decode-only baseline" % (
                                phase, path, dtype, B, ctx))
                            continue
                        need = memory_estimate(cfg, phase, path, B, ctx, f16)
                        if need > budget:
                            print("%-7s %-14s %-5s %5d %6d  skipped: needs about %.0f MiB, more than the %.0f MiB "
                                  "budget (--max-mem)" % (phase, path, dtype, B, ctx, need / 2 ** 20, budget / 2 ** 20))
                            continue
                        print("torch_baseline: %s %s %s batch %d ctx %d" % (phase, path, dtype, B, ctx),
                              file=sys.stderr, flush=True)
                        if decode:
                            step, counts = decode_case(cfg, path, B, ctx, f16, gen)
                        else:
                            step, counts = layer_case(cfg, phase, path, B, ctx, f16, gen)
                        t = time_step(step, a.quick, a.max_time, flush)
                        note = "f16 cache converted to float32 in every step" if f16 else ""
                        row = make_row(cfg, preset, phase, path, B, ctx, dtype, t, counts, peaks, note)
                        print_row(row)
                        rows.append(row)
                        del step
                        if a.json:
                            with open(a.json + ".tmp", "w") as f:
                                json.dump(rows, f, indent=1)
                            os.replace(a.json + ".tmp", a.json)
    if a.json and not rows:
        with open(a.json, "w") as f:
            json.dump(rows, f)


if __name__ == "__main__":
    main()
