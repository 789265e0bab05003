"""A DeepSeek-V2-Lite-shaped attention layer with random weights on the default OpenCL device
(CLMLA_DEVICE or the first GPU, else PoCL's CPU device): a prefill, then decode steps through the
paged latent cache, checked against the float64 numpy reference.

    python python/examples/run_layer.py [DEVICE_SPEC]
"""
import sys
import time

import numpy as np

import clmla
from clmla import reference

ctx = clmla.Context(sys.argv[1] if len(sys.argv) > 1 else None)
print("device:", ctx.device.name)

cfg = clmla.LayerConfig.from_preset("v2-lite")  # D 2048, 16 heads, kv_lora_rank 512
rng = np.random.default_rng(0)
D, H, rkv = cfg.hidden_size, cfg.num_heads, cfg.kv_lora_rank
dn, dr, dv = cfg.qk_nope_head_dim, cfg.qk_rope_head_dim, cfg.v_head_dim
weights = {  # checkpoint names and layout ([out, in]); torch CPU tensors work as well
    "q_proj": rng.standard_normal((H * (dn + dr), D), np.float32) / D ** 0.5,
    "kv_a_proj_with_mqa": rng.standard_normal((rkv + dr, D), np.float32) / D ** 0.5,
    "kv_a_layernorm": np.ones(rkv, np.float32),
    "kv_b_proj": rng.standard_normal((H * (dn + dv), rkv), np.float32) / rkv ** 0.5,
    "o_proj": rng.standard_normal((D, H * dv), np.float32) / (H * dv) ** 0.5,
}
layer = clmla.Layer(cfg, weights, context=ctx)
cache = clmla.Cache(ctx, blocks=16, block_tokens=64, dtype="f32", config=cfg)

x = rng.uniform(-1, 1, (136, D)).astype(np.float32)
seq = cache.add()
t0 = time.perf_counter()
out = [layer(x[:128], batch=[(seq, 128)], cache=cache)]          # prefill: 128 tokens
for t in range(128, 136):                                         # decode: one token a step
    out.append(layer(x[t:t + 1], batch=[(seq, 1)], cache=cache))
out = np.concatenate(out)
print("%d tokens in %.0f ms; the sequence holds %d; %d bytes/token in the cache" % (
    len(x), (time.perf_counter() - t0) * 1e3, seq.length(), cache.info().bytes_per_token_per_layer))

ref = reference.mla_forward(cfg, weights, x)
print("max relative error against float64: %.1e" % (np.abs(out - ref).max() / np.abs(ref).max()))
