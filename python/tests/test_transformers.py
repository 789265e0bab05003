"""clmla against transformers' own DeepSeek-V2 / V3 attention modules (float64, eager attention),
on random-weight folders: the module's weights saved as a model folder with transformers' own
config.json, loaded by Layer.from_pretrained, and handed over directly as torch tensors
(Layer(config, attn.state_dict())), float32 and bfloat16.

Skipped where torch or transformers is missing. Run with:
    build/parity-venv/bin/python -m pytest python/tests/test_transformers.py
"""

import json
import os

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import clmla  # noqa: E402

from conftest import TINY_DEEPSEEK, rel_err, run_sequence, write_safetensors  # noqa: E402

BASE = dict(TINY_DEEPSEEK, vocab_size=32, num_hidden_layers=1)
YARN = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 40.0, "original_max_position_embeddings": 4096,
        "beta_fast": 32, "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0}
YARN_V2 = dict(YARN, mscale=0.707, mscale_all_dim=0.707)

CASES = {
    "v3-yarn": ("deepseek_v3", dict(BASE, rope_parameters=YARN, max_position_embeddings=163840)),
    "v3-bias-halfsplit": ("deepseek_v3", dict(BASE, rope_parameters=YARN, max_position_embeddings=163840,
                                              attention_bias=True, rope_interleave=False)),
    "v3-qproj-default": ("deepseek_v3", dict(BASE, q_lora_rank=None,
                                             rope_parameters={"rope_type": "default", "rope_theta": 50000.0})),
    "v2-yarn-qproj": ("deepseek_v2", dict(BASE, q_lora_rank=None, rope_parameters=YARN_V2,
                                          max_position_embeddings=163840)),
    "v2-yarn-qlora": ("deepseek_v2", dict(BASE, rope_parameters=YARN_V2, max_position_embeddings=163840)),
}


def module(family, cfg_kw, seed):
    cfg = transformers.AutoConfig.for_model(family, **cfg_kw)
    cfg._attn_implementation = "eager"
    mod = __import__("transformers.models.%s.modeling_%s" % (family, family), fromlist=["x"])
    prefix = "DeepseekV3" if family == "deepseek_v3" else "DeepseekV2"
    attn = getattr(mod, prefix + "Attention")(cfg, layer_idx=0)
    rotary = getattr(mod, prefix + "RotaryEmbedding")(cfg)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in attn.named_parameters():
            if "norm" in name:
                p.copy_(1.0 + 0.25 * torch.randn(p.shape, generator=g))
            elif name.endswith("bias"):
                p.copy_(0.1 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(0.1 * torch.randn(p.shape, generator=g))
    return cfg, attn.eval(), rotary


def reference(attn, rotary, x):
    """transformers' attention output over the whole causal sequence, float64."""
    attn = attn.double()
    T = x.shape[0]
    h = torch.from_numpy(x.astype(np.float64))[None]
    pos = torch.arange(T)[None]
    pe = rotary(h, pos)
    mask = torch.full((T, T), float("-inf"), dtype=torch.float64).triu(1)[None, None]
    with torch.no_grad():
        out = attn(hidden_states=h, position_embeddings=pe, attention_mask=mask)
    return (out[0] if isinstance(out, tuple) else out)[0].numpy()


def write_folder(folder, cfg, attn):
    os.makedirs(folder, exist_ok=True)
    d = cfg.to_dict()
    d.pop("_attn_implementation", None)
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(d, f, indent=1, default=str)
    tensors = {"model.layers.0.self_attn." + k: v.detach().float().numpy() for k, v in attn.state_dict().items()}
    write_safetensors(os.path.join(folder, "model.safetensors"), tensors)


@pytest.fixture(scope="module")
def ctx():
    c = clmla.Context(clblast_tuning="auto")
    yield c
    c.close()


@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.parametrize("path", ["auto", "absorbed", "decompressed"])
def test_folder_matches_transformers(ctx, tmp_path, name, path):
    family, kw = CASES[name]
    cfg, attn, rotary = module(family, kw, seed=len(name))
    write_folder(str(tmp_path), cfg, attn)
    x = np.random.default_rng(3).uniform(-1, 1, (11, cfg.hidden_size)).astype(np.float32)
    layer = clmla.Layer.from_pretrained(str(tmp_path), layer=0, context=ctx)
    y, _, _ = run_sequence(layer, x, 5, path=path, block_tokens=4)
    ref = reference(attn, rotary, x)
    assert rel_err(y, ref) < 1e-5, name


@pytest.mark.parametrize("name", ["v3-yarn", "v2-yarn-qproj"])
def test_torch_state_dict(ctx, name):
    """Layer(config, attn.state_dict()) with float32 and bfloat16 torch tensors."""
    family, kw = CASES[name]
    cfg, attn, rotary = module(family, kw, seed=7)
    x = np.random.default_rng(5).uniform(-1, 1, (9, cfg.hidden_size)).astype(np.float32)
    lc = clmla.LayerConfig.from_preset("v3")  # then the shapes and RoPE of this module
    c = cfg
    lc = lc.replace(hidden_size=c.hidden_size, num_heads=c.num_attention_heads, q_lora_rank=c.q_lora_rank or 0,
                    kv_lora_rank=c.kv_lora_rank, qk_nope_head_dim=c.qk_nope_head_dim,
                    qk_rope_head_dim=c.qk_rope_head_dim, v_head_dim=c.v_head_dim, rope_theta=10000.0,
                    yarn_factor=40.0, yarn_mscale=c.rope_parameters["mscale"],
                    yarn_mscale_all_dim=c.rope_parameters["mscale_all_dim"])
    sd = attn.state_dict()
    layer = clmla.Layer(lc, sd, context=ctx)
    y, _, _ = run_sequence(layer, torch.from_numpy(x), 4)
    assert rel_err(y, reference(attn, rotary, x)) < 1e-5
    # bfloat16 tensors: the layer keeps bf16; transformers runs the same rounded values in float64
    sd16 = {k: (v.to(torch.bfloat16) if v.ndim == 2 else v) for k, v in sd.items()}
    layer16 = clmla.Layer(lc, sd16, context=ctx)
    assert layer16.memory()["kv_b_proj"] < layer.memory()["kv_b_proj"]
    with torch.no_grad():
        for k, p in attn.named_parameters():
            if p.ndim == 2:
                p.copy_(p.to(torch.bfloat16).double())
    y16, _, _ = run_sequence(layer16, x, 4)
    assert rel_err(y16, reference(attn, rotary, x)) < 1e-5
    # what is refused
    with pytest.raises(clmla.Error):
        clmla.Layer(lc, {k: v.to(torch.int32) for k, v in sd.items()}, context=ctx)
    if hasattr(torch, "float8_e4m3fn"):
        with pytest.raises(clmla.Error) as e:
            clmla.Layer(lc, dict(sd, **{"o_proj.weight": sd["o_proj.weight"].to(torch.float8_e4m3fn)}), context=ctx)
        assert e.value.status == "CLMLA_ERROR_MISSING_TENSOR"  # no block scales
    # activations in bfloat16 are taken (converted to float32), integer ones refused
    c2 = clmla.Cache(ctx, blocks=1, config=layer)
    xb = torch.from_numpy(x).to(torch.bfloat16)
    yb = layer(xb, batch=[(c2.add(), 9)], cache=c2)
    c3 = clmla.Cache(ctx, blocks=1, config=layer)
    np.testing.assert_array_equal(yb, layer(xb.float().numpy(), batch=[(c3.add(), 9)], cache=c3))
    with pytest.raises(clmla.Error):
        layer(torch.zeros((1, cfg.hidden_size), dtype=torch.int32), batch=[(c2.add(), 1)], cache=c2)
