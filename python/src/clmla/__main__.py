"""python -m clmla devices | demo: the command line's `clmla devices` and `clmla demo`, through the
Python binding."""

from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np

import clmla
from clmla import reference


def cmd_devices(argv) -> int:
    ap = argparse.ArgumentParser(prog="python -m clmla devices", description="every OpenCL device")
    ap.add_argument("--json", action="store_true", help="a JSON array")
    a = ap.parse_args(argv)
    try:
        devs = clmla.devices()
    except clmla.Error as e:
        print("clmla devices: %s" % e.message, file=sys.stderr)
        return 1
    if a.json:
        print(json.dumps([{
            "index": d.index, "platform_device": d.spec, "type": d.kind, "platform": d.platform_name,
            "vendor": d.vendor, "name": d.name, "device_version": d.device_version,
            "driver_version": d.driver_version, "global_mem_mib": d.global_mem_bytes >> 20,
            "compute_units": d.compute_units, "max_work_group_size": d.max_work_group_size,
            "local_mem_kib": d.local_mem_bytes >> 10, "fp16": d.fp16, "default": d.is_default} for d in devs],
            indent=1))
        return 0
    print("   %-3s %-5s %-5s %-22s %9s %4s %6s %7s %4s  %s" % ("#", "P:D", "type", "vendor", "mem MiB", "CUs",
                                                              "max WG", "lmem KiB", "fp16", "name"))
    for d in devs:  # the name last and whole
        print("%s  %-3d %-5s %-5s %-22.22s %9d %4d %6d %7d %4s  %s" % (
            "*" if d.is_default else " ", d.index, d.spec, d.kind, d.vendor, d.global_mem_bytes >> 20,
            d.compute_units, d.max_work_group_size, d.local_mem_bytes >> 10, "yes" if d.fp16 else "no", d.name))
    print("\n* = picked by the default spec (CLMLA_DEVICE unset: first GPU, else first device)")
    return 0


def random_weights(cfg: clmla.LayerConfig, rng: np.random.Generator) -> dict:
    """Weights ~ U(-1/sqrt(fan_in), 1/sqrt(fan_in)), norms ~ 1 + U(-0.1, 0.1), float32."""
    D, H, rq, rkv = cfg.hidden_size, cfg.num_heads, cfg.q_lora_rank, cfg.kv_lora_rank
    dn, dr, dv = cfg.qk_nope_head_dim, cfg.qk_rope_head_dim, cfg.v_head_dim

    def u(rows, cols):
        return rng.uniform(-1, 1, (rows, cols)).astype(np.float32) / np.float32(np.sqrt(cols))

    w = {}
    if rq:
        w["q_a_proj"] = u(rq, D)
        w["q_a_layernorm"] = (1 + 0.1 * rng.uniform(-1, 1, rq)).astype(np.float32)
        w["q_b_proj"] = u(H * (dn + dr), rq)
    else:
        w["q_proj"] = u(H * (dn + dr), D)
    w["kv_a_proj_with_mqa"] = u(rkv + dr, D)
    w["kv_a_layernorm"] = (1 + 0.1 * rng.uniform(-1, 1, rkv)).astype(np.float32)
    w["kv_b_proj"] = u(H * (dn + dv), rkv)
    w["o_proj"] = u(D, H * dv)
    return w


def cmd_demo(argv) -> int:
    ap = argparse.ArgumentParser(prog="python -m clmla demo",
                                 description="DeepSeek-shaped MLA with random weights: a prefill step, then token-by-"
                                             "token decode through the paged latent cache; prints speed, cache size "
                                             "and the error against a float64 numpy reference.")
    ap.add_argument("--device", default=None, help="device spec (see devices)")
    ap.add_argument("--preset", default="v2-lite", choices=["v2-lite", "v2", "v3", "kimi-k2"])
    ap.add_argument("--prefill", type=int, default=512)
    ap.add_argument("--decode", type=int, default=64)
    ap.add_argument("--cache-dtype", default="f32", choices=["f32", "f16", "bf16", "fp8"])
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--no-check", action="store_true", help="skip the float64 reference check")
    a = ap.parse_args(argv)
    if a.prefill < 1 or a.decode < 0:
        print("python -m clmla demo: need --prefill >= 1 and --decode >= 0", file=sys.stderr)
        return 2
    T = a.prefill + a.decode
    try:
        ctx = clmla.Context(a.device, clblast_tuning="auto")
        d = ctx.device
        print("device       %s (%s, %s), %d compute units" % (d.name, d.platform_name, d.driver_version,
                                                               d.compute_units))
        cfg = clmla.LayerConfig.from_preset(a.preset)
        print("model        %s attention shape: D %d, %d heads, q_lora_rank %d, kv_lora_rank %d, head dims %d/%d/%d, "
              "YaRN s=%g" % (a.preset, cfg.hidden_size, cfg.num_heads, cfg.q_lora_rank, cfg.kv_lora_rank,
                             cfg.qk_nope_head_dim, cfg.qk_rope_head_dim, cfg.v_head_dim, cfg.yarn_factor))
        rng = np.random.default_rng(a.seed)
        w = random_weights(cfg, rng)
        x = rng.uniform(-1, 1, (T, cfg.hidden_size)).astype(np.float32)
        print("setup        building kernels and uploading weights...", flush=True)
        t0 = time.perf_counter()
        layer = clmla.Layer(cfg, w, context=ctx)
        bt = 64
        blocks = -(-max(T, clmla.WARMUP_TOKENS) // bt) + 2
        cache = clmla.Cache(ctx, blocks=blocks, block_tokens=bt, dtype=a.cache_dtype, config=cfg)
        layer.warmup(cache)
        print("setup        %.1f s (kernel builds, weight upload, warm-up)" % (time.perf_counter() - t0))
        seq = cache.add()
        out = np.empty((T, cfg.hidden_size), np.float32)
        t0 = time.perf_counter()
        layer(x[: a.prefill], batch=[(seq, a.prefill)], cache=cache, out=out[: a.prefill])
        dt = time.perf_counter() - t0
        path = layer.auto_path(0, a.prefill)
        print("prefill      %d tokens in %.1f ms: %.0f tokens/s (%s path)" % (a.prefill, dt * 1e3, a.prefill / dt, path))
        ms = []
        for i in range(a.prefill, T):
            t0 = time.perf_counter()
            layer(x[i: i + 1], batch=[(seq, 1)], cache=cache, out=out[i: i + 1])
            ms.append((time.perf_counter() - t0) * 1e3)
        if ms:
            ms.sort()
            print("decode       %d tokens at context %d..%d: median %.2f ms/token (min %.2f, max %.2f; absorbed path)" % (
                a.decode, a.prefill + 1, T, ms[len(ms) // 2], ms[0], ms[-1]))
        info = cache.info()
        elem = {"f32": 4, "f16": 2, "bf16": 2, "fp8": 1}[a.cache_dtype]
        mha = cfg.num_heads * (cfg.qk_nope_head_dim + cfg.qk_rope_head_dim + cfg.v_head_dim) * elem
        print("kv cache     %d bytes/token/layer (%s c^KV + k^R); standard MHA would cache %d: %.1fx less" % (
            info.bytes_per_token_per_layer, a.cache_dtype, mha, mha / info.bytes_per_token_per_layer))
        mem = layer.memory()
        print("weights      %.1f MiB on the device" % (mem["total"] / 1048576))
        if a.no_check:
            print("check        skipped (--no-check)")
            return 0
        print("check        float64 numpy reference of all %d tokens..." % T, flush=True)
        ref = reference.mla_forward(cfg, w, x, cache_dtype=a.cache_dtype)
        err_last = float(np.max(np.abs(out[-1] - ref[-1])) / np.max(np.abs(ref[-1])))
        err_all = float(np.max(np.abs(out - ref)) / np.max(np.abs(ref)))
        # the reference rounds the cache from float64, the layer from float32: an fp8 code can land
        # one step apart where the two straddle a rounding boundary
        tol = {"f32": 1e-4, "f16": 2e-3, "bf16": 2e-3, "fp8": 1e-3}[a.cache_dtype]
        ok = err_last <= tol and err_all <= tol
        print("check        max relative error, last step %.2e, all %d tokens %.2e (tolerance %.0e): %s" % (
            err_last, T, err_all, tol, "OK" if ok else "FAILED"))
        return 0 if ok else 1
    except clmla.Error as e:
        print("python -m clmla demo: %s" % e, file=sys.stderr)
        return 1


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    cmds = {"devices": cmd_devices, "demo": cmd_demo}
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in cmds:
        print("usage: python -m clmla devices [--json] | demo [--preset NAME --prefill N --decode N "
              "--cache-dtype f32|f16|bf16|fp8 --device SPEC]\n       clmla %s, libclmla %s (%s)" % (
                  clmla.__version__, clmla.version(), clmla.library_path), file=sys.stderr if argv else sys.stdout)
        return 0 if argv and argv[0] in ("-h", "--help") else 2
    return cmds[argv[0]](argv[1:])


if __name__ == "__main__":
    sys.exit(main())
