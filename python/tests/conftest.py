"""Shared fixtures and helpers: small random-weight layers, and model folders written with numpy
alone (config.json + safetensors)."""

import json
import os
import struct

import numpy as np
import pytest

import clmla

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))

# The shape of the tiny random DeepSeek models that the transformers tests build (each test file adds
# its vocabulary and layer count), as transformers' config keywords.
TINY_DEEPSEEK = dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=4, q_lora_rank=24, kv_lora_rank=32,
                     qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16, intermediate_size=16,
                     moe_intermediate_size=8, n_routed_experts=2, num_experts_per_tok=1, n_shared_experts=1,
                     first_k_dense_replace=1, n_group=1, topk_group=1, max_position_embeddings=256,
                     tie_word_embeddings=False)

# Tiny DeepSeek shapes: V3-like (query LoRA, YaRN) and V2-Lite-like (q_proj, default RoPE).
V3_SMALL = dict(hidden_size=64, num_heads=4, q_lora_rank=24, kv_lora_rank=32, qk_nope_head_dim=16,
                qk_rope_head_dim=8, v_head_dim=16, rope_theta=10000.0, yarn_factor=40.0,
                yarn_original_max_position=4096, yarn_beta_fast=32.0, yarn_beta_slow=1.0, yarn_mscale=1.0,
                yarn_mscale_all_dim=1.0)
V2_SMALL = dict(hidden_size=48, num_heads=6, q_lora_rank=0, kv_lora_rank=24, qk_nope_head_dim=8,
                qk_rope_head_dim=4, v_head_dim=12, rope_theta=50000.0)


def rel_err(y, ref):
    y, ref = np.asarray(y, np.float64), np.asarray(ref, np.float64)
    assert y.shape == ref.shape, (y.shape, ref.shape)
    return float(np.max(np.abs(y - ref)) / np.max(np.abs(ref)))


def random_weights(cfg, seed=0, bias=False):
    """float32 weights, checkpoint layout, under their short names."""
    rng = np.random.default_rng(seed)
    D, H, rq, rkv = cfg["hidden_size"], cfg["num_heads"], cfg["q_lora_rank"], cfg["kv_lora_rank"]
    dn, dr, dv = cfg["qk_nope_head_dim"], cfg["qk_rope_head_dim"], cfg["v_head_dim"]

    def m(r, c):
        return (rng.standard_normal((r, c)) / np.sqrt(c)).astype(np.float32)

    w = {}
    if rq:
        w["q_a_proj"] = m(rq, D)
        w["q_a_layernorm"] = (1 + 0.25 * rng.standard_normal(rq)).astype(np.float32)
        w["q_b_proj"] = m(H * (dn + dr), rq)
    else:
        w["q_proj"] = m(H * (dn + dr), D)
    w["kv_a_proj_with_mqa"] = m(rkv + dr, D)
    w["kv_a_layernorm"] = (1 + 0.25 * rng.standard_normal(rkv)).astype(np.float32)
    w["kv_b_proj"] = m(H * (dn + dv), rkv)
    w["o_proj"] = m(D, H * dv)
    if bias:
        if rq:
            w["q_a_proj_bias"] = (0.1 * rng.standard_normal(rq)).astype(np.float32)
        w["kv_a_proj_with_mqa_bias"] = (0.1 * rng.standard_normal(rkv + dr)).astype(np.float32)
        w["o_proj_bias"] = (0.1 * rng.standard_normal(D)).astype(np.float32)
    return w


def random_x(T, D, seed=1):
    return np.random.default_rng(seed).uniform(-1, 1, (T, D)).astype(np.float32)


# ---- safetensors and model folders, numpy only ----------------------------------------------------------

_ST_DTYPES = {np.dtype(np.float32): "F32", np.dtype(np.float16): "F16", np.dtype(np.float64): "F64"}


def write_safetensors(path, tensors):
    """tensors: name -> array (float32/16/64), or name -> (raw array, "BF16"/"F8_E4M3")."""
    header, blobs, off = {}, [], 0
    for name, t in tensors.items():
        if isinstance(t, tuple):
            arr, dt = np.ascontiguousarray(t[0]), t[1]
        else:
            arr = np.ascontiguousarray(t)
            dt = _ST_DTYPES[arr.dtype]
        b = arr.astype(arr.dtype.newbyteorder("<")).tobytes()
        header[name] = {"dtype": dt, "shape": list(arr.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


def config_json(cfg, num_layers, model_type="deepseek_v3", bias=False):
    c = {
        "model_type": model_type,
        "architectures": ["DeepseekV3ForCausalLM" if model_type == "deepseek_v3" else "DeepseekV2ForCausalLM"],
        "hidden_size": cfg["hidden_size"],
        "num_attention_heads": cfg["num_heads"],
        "num_key_value_heads": cfg["num_heads"],
        "q_lora_rank": cfg["q_lora_rank"] or None,
        "kv_lora_rank": cfg["kv_lora_rank"],
        "qk_nope_head_dim": cfg["qk_nope_head_dim"],
        "qk_rope_head_dim": cfg["qk_rope_head_dim"],
        "v_head_dim": cfg["v_head_dim"],
        "num_hidden_layers": num_layers,
        "rms_norm_eps": 1e-6,
        "rope_theta": cfg.get("rope_theta", 10000.0),
        "max_position_embeddings": 163840,
        "intermediate_size": 64,
        "rope_scaling": None,
    }
    if cfg.get("yarn_factor", 0) > 1:
        c["rope_scaling"] = {"type": "yarn", "factor": cfg["yarn_factor"], "beta_fast": cfg["yarn_beta_fast"],
                             "beta_slow": cfg["yarn_beta_slow"], "mscale": cfg["yarn_mscale"],
                             "mscale_all_dim": cfg["yarn_mscale_all_dim"],
                             "original_max_position_embeddings": cfg["yarn_original_max_position"]}
    if bias:
        c["attention_bias"] = True
    return c


def write_model(folder, cfg, num_layers=2, seed=0, bias=False, model_type="deepseek_v3", extra=True):
    """A model folder: config.json and model.safetensors with every layer's attention (and, with
    extra, tensors the loader must ignore). Returns the per-layer weights."""
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(config_json(cfg, num_layers, model_type, bias), f, indent=1)
    tensors, layers = {}, []
    for i in range(num_layers):
        w = random_weights(cfg, seed + 17 * i, bias)
        layers.append(w)
        for name, a in w.items():
            suffix = ".bias" if name.endswith("_bias") else ".weight"
            base = name[: -len("_bias")] if name.endswith("_bias") else name
            tensors["model.layers.%d.self_attn.%s%s" % (i, base, suffix)] = a
        if extra:
            tensors["model.layers.%d.mlp.gate_proj.weight" % i] = np.zeros((4, cfg["hidden_size"]), np.float32)
    if extra:
        tensors["model.embed_tokens.weight"] = np.ones((8, cfg["hidden_size"]), np.float32)
    write_safetensors(os.path.join(folder, "model.safetensors"), tensors)
    return layers


@pytest.fixture(scope="session")
def ctx():
    c = clmla.Context(clblast_tuning="auto")
    yield c
    c.close()


def steps(T, P):
    """A prefill of P tokens, then decode steps of one."""
    out = [(0, P)] if P else []
    return out + [(t, t + 1) for t in range(P, T)]


def run_sequence(layer, x, P, cache=None, path="auto", blocks=None, block_tokens=64, dtype="f32"):
    """Prefill P tokens then decode the rest one at a time, as `clmla run` does."""
    T = x.shape[0]
    if cache is None:
        cache = clmla.Cache(layer.context, blocks=blocks or (-(-T // block_tokens)), block_tokens=block_tokens,
                            dtype=dtype, config=layer)
    seq = cache.add()
    y = np.empty_like(x, dtype=np.float32)
    for lo, hi in steps(T, P):
        y[lo:hi] = layer(x[lo:hi], batch=[(seq, hi - lo)], cache=cache, path=path)
    return y, cache, seq
