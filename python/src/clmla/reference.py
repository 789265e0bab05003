"""A float64 numpy implementation of docs/MLA.md, for checking: written from the math, independent
of libclmla. It covers the DeepSeek layouts: query LoRA or q_proj, optional biases, default /
linear / YaRN RoPE with interleaved or half-split pairs, and the cache's rounding (f32, f16, bf16).

    y = clmla.reference.mla_forward(config, weights, x)   # x [T, D] at positions 0..T-1

Causal attention over all T tokens is what a prefill followed by decode steps computes.
"""

from __future__ import annotations

import math
from typing import Mapping

import numpy as np

__all__ = ["mla_forward", "rope_tables", "softmax_scale", "round_bf16", "round_cache"]


def _get(cfg, name, default=0):
    v = getattr(cfg, name, None) if not isinstance(cfg, Mapping) else cfg.get(name)
    return default if v is None else v


def _g(s, m):
    return 1.0 if s <= 1 else 0.1 * m * math.log(s) + 1.0


def _rope_kind(cfg):
    t = _get(cfg, "rope_type", "auto")
    if t in ("auto", 0):
        return "yarn" if _get(cfg, "yarn_factor", 0.0) > 1 else "default"
    return {1: "default", 2: "linear", 3: "yarn", 6: "none"}.get(t, t)


def softmax_scale(cfg) -> float:
    """tau (docs/MLA.md section 4)."""
    dq = _get(cfg, "qk_nope_head_dim") + _get(cfg, "qk_rope_head_dim")
    tau = dq ** -0.5
    kind = _rope_kind(cfg)
    s = _get(cfg, "yarn_factor", 0.0)
    m_all = _get(cfg, "yarn_mscale_all_dim", 0.0)
    if kind != "default" and kind != "none" and m_all:
        tau *= _g(s, m_all) ** 2
    return tau


def rope_tables(cfg, positions):
    """(A cos, A sin) [len(positions), dr/2] in float64."""
    dr = _get(cfg, "qk_rope_head_dim")
    theta = _get(cfg, "rope_theta", 0.0) or 10000.0
    i = np.arange(dr // 2, dtype=np.float64)
    f0 = theta ** (-2.0 * i / dr)
    kind = _rope_kind(cfg)
    A = 1.0
    f = f0
    s = _get(cfg, "yarn_factor", 0.0)
    if kind == "linear":
        f = f0 / s
    elif kind == "yarn":
        L = _get(cfg, "yarn_original_max_position", 0) or 4096
        bf = _get(cfg, "yarn_beta_fast", 0.0) or 32.0
        bs = _get(cfg, "yarn_beta_slow", 0.0) or 1.0

        def cd(r):
            return dr * math.log(L / (2 * math.pi * r)) / (2 * math.log(theta))

        if _get(cfg, "yarn_no_truncate", 0):
            low, high = max(cd(bf), 0.0), min(cd(bs), dr - 1.0)
        else:
            low, high = max(math.floor(cd(bf)), 0), min(math.ceil(cd(bs)), dr - 1)
        if low == high:
            high += 0.001
        ramp = np.clip((i - low) / (high - low), 0.0, 1.0)
        f = f0 * (1.0 - ramp + ramp / s)
        A = _get(cfg, "rope_attention_factor", 0.0) or _g(s, _get(cfg, "yarn_mscale", 0.0)) / _g(
            s, _get(cfg, "yarn_mscale_all_dim", 0.0))
    elif kind == "none":
        f = np.zeros_like(f0)
    elif kind != "default":
        raise NotImplementedError("reference: rope type %r" % kind)
    ang = np.asarray(positions, np.float64)[:, None] * f[None, :]
    return A * np.cos(ang), A * np.sin(ang)


def _rotate(v, cos, sin, half_split):
    """v [T, ..., dr] rotated per token (cos/sin [T, dr/2])."""
    v = v.copy()
    shape = (v.shape[0],) + (1,) * (v.ndim - 2) + (cos.shape[1],)
    c, s = cos.reshape(shape), sin.reshape(shape)
    h = cos.shape[1]
    if half_split:
        a, b = v[..., :h].copy(), v[..., h:].copy()
        v[..., :h], v[..., h:] = a * c - b * s, a * s + b * c
    else:
        a, b = v[..., 0::2].copy(), v[..., 1::2].copy()
        v[..., 0::2], v[..., 1::2] = a * c - b * s, a * s + b * c
    return v


def _rms(v, w, eps):
    return w * v / np.sqrt(np.mean(v * v, axis=-1, keepdims=True) + eps)


def round_bf16(a):
    """float32 -> bfloat16 -> float64, round to nearest even."""
    b = np.asarray(a, np.float32).view(np.uint32).astype(np.uint64)
    b = (b + 0x7FFF + ((b >> 16) & 1)) & 0xFFFF0000
    return b.astype(np.uint32).view(np.float32).astype(np.float64)


def round_e4m3(a):
    """float64 -> float8 e4m3 -> float64: 4 significant bits, subnormals below 2^-6 on a grid of
    2^-9, ties to even, magnitudes past 448 saturating to 448."""
    a = np.asarray(a, np.float64)
    mag = np.abs(a)
    e = np.floor(np.log2(np.where(mag > 0, mag, 1.0)))
    ulp = np.exp2(np.maximum(e, -6.0) - 3.0)
    r = np.round(a / ulp) * ulp
    return np.where(np.abs(r) > 448.0, np.copysign(448.0, a), r)


def round_fp8_latent(ckv):
    """c^KV [.., rkv] as FlashMLA's fp8 cache holds it: per tile of 128 values the scale
    s = 2^ceil(log2(max(max|x| / 448, 1e-4))), each value e4m3(x / s) * s (rkv a multiple of 128)."""
    c = np.asarray(ckv, np.float64)
    t = c.reshape(c.shape[:-1] + (c.shape[-1] // 128, 128))
    m, e = np.frexp(np.maximum(np.max(np.abs(t), axis=-1, keepdims=True) / 448.0, 1e-4))
    s = np.ldexp(1.0, np.where(m == 0.5, e - 1, e))
    return (round_e4m3(t / s) * s).reshape(c.shape)


def round_cache(a, dtype):
    """A value as the cache of that dtype stores it (f32, f16, bf16; fp8: mla_forward rounds c^KV
    with round_fp8_latent and k^R to bf16)."""
    if dtype == "f32":
        return np.asarray(a, np.float32).astype(np.float64)
    if dtype == "f16":
        return np.asarray(a, np.float64).astype(np.float16).astype(np.float64)
    if dtype == "bf16":
        return round_bf16(a)
    raise NotImplementedError("reference: cache dtype %r" % dtype)


def mla_forward(cfg, weights: Mapping[str, np.ndarray], x, cache_dtype: str = None, positions=None,
                return_cache: bool = False, heads=None):
    """The attention output [T, D] for hidden states x [T, D] of one sequence (float64).

    cfg: a LayerConfig or a mapping with its field names. weights: float arrays under the short
    checkpoint names (q_a_proj, q_a_layernorm, q_b_proj or q_proj, kv_a_proj_with_mqa,
    kv_a_layernorm, kv_b_proj, o_proj, optional q_a_proj_bias, kv_a_proj_with_mqa_bias,
    o_proj_bias). cache_dtype: round c^KV and k^R as a cache of that dtype stores them (None: no
    rounding). heads: an iterable of head indices to sum (a tensor-parallel shard; None: all, and
    the o_proj bias is added only when heads is None or includes head 0's shard start)."""
    W = {k: np.asarray(v, np.float64) for k, v in weights.items() if v is not None}
    x = np.asarray(x, np.float64)
    T = x.shape[0]
    H = _get(cfg, "num_heads")
    rq = _get(cfg, "q_lora_rank")
    rkv = _get(cfg, "kv_lora_rank")
    dn, dr, dv = _get(cfg, "qk_nope_head_dim"), _get(cfg, "qk_rope_head_dim"), _get(cfg, "v_head_dim")
    dq = dn + dr
    eps = _get(cfg, "rms_norm_eps", 0.0) or 1e-6
    half = _get(cfg, "rope_pairing", "interleaved") in ("half_split", "half-split", 1)
    pos = np.arange(T) if positions is None else np.asarray(positions)

    if rq:
        cq = x @ W["q_a_proj"].T
        if "q_a_proj_bias" in W:
            cq = cq + W["q_a_proj_bias"]
        cq = _rms(cq, W["q_a_layernorm"], eps)
        q = cq @ W["q_b_proj"].T
    else:
        q = x @ W["q_proj"].T
    q = q.reshape(T, H, dq)
    kv = x @ W["kv_a_proj_with_mqa"].T
    if "kv_a_proj_with_mqa_bias" in W:
        kv = kv + W["kv_a_proj_with_mqa_bias"]
    ckv = _rms(kv[:, :rkv], W["kv_a_layernorm"], eps)
    cos, sin = rope_tables(cfg, pos)
    kr = _rotate(kv[:, rkv:], cos, sin, half)
    qn, qr = q[:, :, :dn], _rotate(q[:, :, dn:], cos, sin, half)
    if cache_dtype == "fp8":
        ckv, kr = round_fp8_latent(np.asarray(ckv, np.float32)), round_bf16(kr)
    elif cache_dtype is not None:
        ckv, kr = round_cache(ckv, cache_dtype), round_cache(kr, cache_dtype)
    tau = softmax_scale(cfg)
    kvb = W["kv_b_proj"].reshape(H, dn + dv, rkv)
    o = np.zeros((T, H, dv))
    mask = np.tril(np.ones((T, T), bool))
    for h in range(H) if heads is None else heads:
        k_nope = ckv @ kvb[h, :dn].T          # [T, dn]
        v = ckv @ kvb[h, dn:].T               # [T, dv]
        s = tau * (qn[:, h] @ k_nope.T + qr[:, h] @ kr.T)
        s = np.where(mask, s, -np.inf)
        s = s - s.max(axis=1, keepdims=True)
        p = np.exp(s)
        p /= p.sum(axis=1, keepdims=True)
        o[:, h] = p @ v
    out = o.reshape(T, H * dv) @ W["o_proj"].T
    if "o_proj_bias" in W and (heads is None or 0 in list(heads)):
        out = out + W["o_proj_bias"]
    if return_cache:
        return out, ckv, kr
    return out
