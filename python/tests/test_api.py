"""The Python API on the default device (PoCL's CPU device in CI), numpy only: every call, the
float64 reference (clmla.reference, numpy) on small shapes, and the error cases."""

import ctypes
import gc
import math

import numpy as np
import pytest

import clmla
from clmla import reference

from conftest import V2_SMALL, V3_SMALL, random_weights, random_x, rel_err, run_sequence

TOL = {"f32": 1e-5, "f16": 5e-4, "bf16": 4e-3}


def config(d, **kw):
    return clmla.LayerConfig(**dict(d, **kw))


# ---- devices, context, versions -------------------------------------------------------------------------

def test_devices_and_resolve():
    devs = clmla.devices()
    assert devs and all(isinstance(d, clmla.Device) for d in devs)
    assert [d.index for d in devs] == list(range(len(devs)))
    assert sum(d.is_default for d in devs) == 1
    assert clmla.resolve_device() == [d.index for d in devs if d.is_default][0]
    assert clmla.resolve_device(devs[0].spec) == 0
    assert clmla.resolve_device(0) == 0
    with pytest.raises(clmla.Error) as e:
        clmla.resolve_device("no-such-device-anywhere")
    assert e.value.status == "CLMLA_ERROR_DEVICE_NOT_FOUND"
    assert devs[0].name in e.value.message  # the message lists the devices


def test_context(ctx):
    d = ctx.device
    assert isinstance(d, clmla.Device) and d.name
    assert ctx.cl_context and ctx.queue
    st = ctx.program_stats()
    assert set(st) == {"built_from_source", "loaded_from_disk", "memory_hits", "disk_rejected", "disk_written"}
    assert "Context" in repr(ctx)
    with clmla.Context(d) as c2:
        assert c2.device.name == d.name
    assert c2.closed and "closed" in repr(c2)
    c2.close()  # idempotent


def test_context_errors():
    with pytest.raises(clmla.Error) as e:
        clmla.Context("1:")
    assert e.value.status == "CLMLA_ERROR_DEVICE_NOT_FOUND" and e.value.code == -5004
    for bad in (3.5, b"gpu", object()):
        with pytest.raises(clmla.Error) as e:
            clmla.Context(bad)
        assert e.value.status == "CLMLA_ERROR_INVALID_ARGUMENT"
    with pytest.raises(clmla.Error):
        clmla.Context(log_level="loud")
    with pytest.raises(clmla.Error):
        clmla.Context("gpu\0")


def test_log_callback(tmp_path):
    got = []
    c = clmla.Context(cache_dir=str(tmp_path), log=lambda level, msg: got.append((level, msg)), log_level="info")
    cfg = config(V2_SMALL)
    layer = clmla.Layer(cfg, random_weights(V2_SMALL), context=c)
    run_sequence(layer, random_x(3, cfg.hidden_size), 2)
    assert got and all(level in ("info", "warning") for level, _ in got)
    assert c.program_stats()["built_from_source"] + c.program_stats()["loaded_from_disk"] > 0

    def raising(level, msg):
        raise RuntimeError("a callback that fails must not crash anything")

    c3 = clmla.Context(cache_dir="off", log=raising, log_level="info")
    l3 = clmla.Layer(cfg, random_weights(V2_SMALL), context=c3)
    run_sequence(l3, random_x(2, cfg.hidden_size), 1)
    c3.close()
    c.close()


def test_program_binaries(tmp_path):
    cfg = config(V2_SMALL)
    for value, stored in (("on", True), ("off", False)):
        folder = tmp_path / value
        c = clmla.Context(cache_dir=str(folder), program_binaries=value)
        layer = clmla.Layer(cfg, random_weights(V2_SMALL), context=c)
        run_sequence(layer, random_x(2, cfg.hidden_size), 1)
        written = c.program_stats()["disk_written"]
        assert (written > 0) == stored, (value, written)
        assert bool(list(folder.glob("*.clbin"))) == stored
        c.close()
    with pytest.raises(clmla.Error, match="program_binaries"):
        clmla.Context(program_binaries="always")


def test_versions():
    assert clmla.version() == clmla.__version__
    assert clmla.library_path


def test_names():
    assert "v2-lite" in clmla.presets() and "moonlight" in clmla.presets()
    assert "deepseek_v3" in clmla.model_types()


# ---- configuration ----------------------------------------------------------------------------------------

def test_presets():
    c = clmla.LayerConfig.from_preset("v2-lite")
    assert (c.hidden_size, c.num_heads, c.q_lora_rank, c.kv_lora_rank) == (2048, 16, 0, 512)
    assert math.isclose(c.softmax_scale, 0.114721, rel_tol=1e-5)
    assert math.isclose(clmla.LayerConfig.from_preset("V3").softmax_scale, 0.135234, rel_tol=1e-5)
    assert clmla.LayerConfig.from_preset("minicpm3-4b").rope_pairing == "half_split"
    m = clmla.LayerConfig.from_preset("minicpm3-4b")
    assert m.rope_type == "longrope" and len(m.longrope_short_factor) == m.qk_rope_head_dim // 2
    m.validate()
    with pytest.raises(clmla.Error) as e:
        clmla.LayerConfig.from_preset("v9")
    assert e.value.status == "CLMLA_ERROR_INVALID_ARGUMENT"


def test_config_roundtrip_and_validate():
    c = config(V3_SMALL)
    c.validate()
    assert math.isclose(c.softmax_scale, reference.softmax_scale(V3_SMALL), rel_tol=1e-12)
    bad = c.replace(qk_rope_head_dim=7)
    with pytest.raises(clmla.Error) as e:
        bad.validate()
    assert e.value.status == "CLMLA_ERROR_INVALID_CONFIG" and e.value.message
    for field, value in (("num_heads", "4"), ("rope_theta", "x"), ("rope_pairing", "sideways"),
                         ("weights_dtype", "f13"), ("num_heads", 2 ** 40), ("num_heads", True)):
        with pytest.raises(clmla.Error):
            c.replace(**{field: value}).validate()
    with pytest.raises(clmla.Error):
        c.replace(longrope_short_factor=(1.0,) * 200).validate()


# ---- the layer against the float64 reference ---------------------------------------------------------------

@pytest.mark.parametrize("shape", ["v3", "v2"])
@pytest.mark.parametrize("path", ["auto", "absorbed", "decompressed"])
def test_layer_matches_reference(ctx, shape, path):
    d = V3_SMALL if shape == "v3" else V2_SMALL
    cfg = config(d)
    w = random_weights(d, seed=3, bias=(shape == "v3"))
    layer = clmla.Layer(cfg, w, context=ctx)
    x = random_x(13, cfg.hidden_size)
    y, cache, seq = run_sequence(layer, x, 6, path=path, block_tokens=4)
    assert y.dtype == np.float32 and y.shape == x.shape
    assert seq.length() == 13 and len(seq) == 13
    ref, ckv, kr = reference.mla_forward(d, w, x, return_cache=True)
    assert rel_err(y, ref) < TOL["f32"]
    c, k = seq.read()
    assert rel_err(c, ckv) < 1e-5 and rel_err(k, kr) < 1e-5
    c2, k2 = seq.read(layer=0, start=5, n=3)
    np.testing.assert_array_equal(c2, c[5:8])
    np.testing.assert_array_equal(k2, k[5:8])


def test_half_split_pairing(ctx):
    d = dict(V2_SMALL, rope_pairing="half_split")
    w = random_weights(d, seed=5)
    layer = clmla.Layer(config(d), w, context=ctx)
    x = random_x(9, d["hidden_size"])
    y, _, _ = run_sequence(layer, x, 4)
    assert rel_err(y, reference.mla_forward(d, w, x)) < TOL["f32"]
    y_inter = reference.mla_forward(V2_SMALL, w, x)
    assert rel_err(y, y_inter) > 1e-3  # the pairing matters


@pytest.mark.parametrize("dtype", ["f16", "bf16"])
def test_cache_dtypes(ctx, dtype):
    w = random_weights(V3_SMALL, seed=7)
    layer = clmla.Layer(config(V3_SMALL), w, context=ctx)
    x = random_x(10, V3_SMALL["hidden_size"])
    y, cache, _ = run_sequence(layer, x, 5, dtype=dtype)
    assert cache.dtype == dtype
    assert cache.info().bytes_per_token_per_layer == 2 * (32 + 8)
    ref = reference.mla_forward(V3_SMALL, w, x, cache_dtype=dtype)
    assert rel_err(y, ref) < TOL[dtype]


def _fp8_decode(codes):
    """e4m3fn codes -> float64 (no NaN codes are used)."""
    c = codes.astype(np.int64)
    s = np.where(c & 0x80, -1.0, 1.0)
    e = (c >> 3) & 0xF
    m = c & 7
    return s * np.where(e == 0, m / 8.0 * 2.0 ** -6, (1 + m / 8.0) * 2.0 ** (e - 7.0))


def _bf16_bits(a):
    b = np.asarray(a, np.float32).view(np.uint32).astype(np.uint64)
    return (((b + 0x7FFF + ((b >> 16) & 1)) >> 16) & 0xFFFF).astype(np.uint16)


def test_weight_dtypes(ctx):
    """Weights given as f16 arrays, bf16 bits and fp8 codes with block scales, and converted at
    creation (weights_dtype), each against the reference fed the same values."""
    d = V3_SMALL
    w = random_weights(d, seed=11)
    x = random_x(7, d["hidden_size"])
    # float16 arrays: kept as f16
    w16 = {k: v.astype(np.float16) if v.ndim == 2 else v for k, v in w.items()}
    y, _, _ = run_sequence(clmla.Layer(config(d), w16, context=ctx), x, 3)
    assert rel_err(y, reference.mla_forward(d, w16, x)) < 1e-5
    # bf16 bits
    wb = {k: clmla.Weight(_bf16_bits(v), "bf16") if v.ndim == 2 else v for k, v in w.items()}
    wb_vals = {k: reference.round_bf16(v) if v.ndim == 2 else v for k, v in w.items()}
    y, _, _ = run_sequence(clmla.Layer(config(d), wb, context=ctx), x, 3)
    assert rel_err(y, reference.mla_forward(d, wb_vals, x)) < 1e-5
    # converted at creation
    layer = clmla.Layer(config(d), w, context=ctx, weights_dtype="f16")
    assert layer.config.weights_dtype == "f16"
    y, _, _ = run_sequence(layer, x, 3)
    w16all = {k: v.astype(np.float16) if v.ndim == 2 else v for k, v in w.items()}
    assert rel_err(y, reference.mla_forward(d, w16all, x)) < 1e-5
    # fp8 codes with block scales
    rng = np.random.default_rng(4)
    w8, w8_vals = dict(w), dict(w)
    for k, v in w.items():
        if v.ndim != 2:
            continue
        codes = rng.integers(0, 0x7F, v.shape, dtype=np.uint8) | (rng.integers(0, 2, v.shape, dtype=np.uint8) << 7)
        codes[(codes & 0x7F) == 0x7F] = 0x38
        sr, sc = -(-v.shape[0] // 128), -(-v.shape[1] // 128)
        scale = np.full((sr, sc), 1.0 / (64 * np.sqrt(v.shape[1])), np.float32)
        w8[k] = clmla.Weight(codes, "fp8", scale)
        w8_vals[k] = _fp8_decode(codes) * float(scale[0, 0])
    y, _, _ = run_sequence(clmla.Layer(config(d), w8, context=ctx), x, 3)
    assert rel_err(y, reference.mla_forward(d, w8_vals, x)) < 1e-5
    # fp8 keys as a checkpoint names them (weight + weight_scale_inv)
    sd = {}
    for k, v in w8.items():
        if isinstance(v, clmla.Weight):
            sd[k + ".weight"], sd[k + ".weight_scale_inv"] = v.data, v.scale
            sd[k + ".weight"] = clmla.Weight(v.data, "fp8")
        else:
            sd[k + ".weight"] = v
    y2, _, _ = run_sequence(clmla.Layer(config(d), sd, context=ctx), x, 3)
    np.testing.assert_array_equal(y, y2)


def test_state_dict_names(ctx):
    d = V3_SMALL
    w = random_weights(d, seed=2, bias=True)
    sd = {}
    for k, v in w.items():
        if k.endswith("_bias"):
            sd["model.layers.0.self_attn." + k[:-5] + ".bias"] = v
        else:
            sd["model.layers.0.self_attn." + k + ".weight"] = v
    x = random_x(5, d["hidden_size"])
    y1, _, _ = run_sequence(clmla.Layer(config(d), w, context=ctx), x, 2)
    y2, _, _ = run_sequence(clmla.Layer(config(d), sd, context=ctx), x, 2)
    np.testing.assert_array_equal(y1, y2)


def test_batches_mix_sequences_and_forks(ctx):
    """Two sequences in one step (a prefill chunk and a decode entry), a fork that then diverges:
    each sequence's outputs are its own reference's."""
    d = V3_SMALL
    w = random_weights(d, seed=9)
    layer = clmla.Layer(config(d), w, context=ctx)
    cache = clmla.Cache(ctx, blocks=16, block_tokens=4, config=layer.config)
    xa, xb = random_x(9, 64, seed=21), random_x(6, 64, seed=22)
    a, b = cache.add(), cache.add()
    ya = np.zeros((9, 64), np.float32)
    yb = np.zeros((6, 64), np.float32)
    ya[:3] = layer(xa[:3], batch=[(a, 3)], cache=cache)
    out = layer(np.concatenate([xa[3:4], xb[:5]]), batch=[(a, 1), (b, 5)], cache=cache)
    ya[3], yb[:5] = out[0], out[1:]
    # fork a after 4 tokens: the fork continues with other tokens
    f = a.fork()
    assert f.length() == 4 and f.blocks()[0] == a.blocks()[0]
    xf = np.concatenate([xa[:4], random_x(3, 64, seed=23)])
    yf = np.zeros((7, 64), np.float32)
    out = layer(np.concatenate([xa[4:9], xb[5:6], xf[4:7]]), batch=[(a, 5), (b, 1), (f, 3)], cache=cache)
    ya[4:9], yb[5], yf[4:7] = out[:5], out[5], out[6:]
    assert rel_err(ya, reference.mla_forward(d, w, xa)) < TOL["f32"]
    assert rel_err(yb, reference.mla_forward(d, w, xb)) < TOL["f32"]
    assert rel_err(yf[4:], reference.mla_forward(d, w, xf)[4:]) < TOL["f32"]
    assert len(cache.sequences) == 3
    # truncate (drop speculative tokens) and go on
    a.truncate(7)
    assert a.length() == 7
    y8 = layer(xa[7:9], batch=[(a, 2)], cache=cache)
    assert rel_err(y8, reference.mla_forward(d, w, xa)[7:9]) < TOL["f32"]
    info = cache.info()
    assert info.sequences == 3 and info.blocks_used + info.blocks_free == info.blocks_total == 16
    f.free()
    assert f.freed and "freed" in repr(f)
    assert cache.info().sequences == 2


def test_multi_layer_cache_and_reserve(ctx):
    d = V2_SMALL
    w0, w1 = random_weights(d, seed=1), random_weights(d, seed=2)
    l0, l1 = clmla.Layer(config(d), w0, context=ctx), clmla.Layer(config(d), w1, context=ctx)
    cache = clmla.Cache(ctx, layers=2, blocks=4, block_tokens=8, config=l0)
    s = cache.add()
    s.reserve(20)
    assert len(s.blocks()) == 3 and cache.info().blocks_free == 1
    x = random_x(6, d["hidden_size"])
    y0 = l0(x, batch=[(s, 6)], cache=cache, cache_layer=0)
    y1 = l1(y0, batch=[(s, 6)], cache=cache, cache_layer=1)
    assert s.length(0) == s.length(1) == 6
    assert rel_err(y1, reference.mla_forward(d, w1, reference.mla_forward(d, w0, x).astype(np.float32))) < 1e-4
    assert cache.buffer(0) and cache.buffer(1) and cache.buffer(0) != cache.buffer(1)
    with pytest.raises(clmla.Error):
        cache.buffer(2)
    with pytest.raises(clmla.Error):
        s.length(2)


def test_warmup_memory_threshold(ctx):
    d = V3_SMALL
    layer = clmla.Layer(config(d), random_weights(d, bias=True), context=ctx)
    small = clmla.Cache(ctx, blocks=2, block_tokens=16, config=layer)
    with pytest.raises(clmla.Error) as e:
        layer.warmup(small)
    assert e.value.status == "CLMLA_ERROR_CACHE_FULL"
    big = clmla.Cache(ctx, blocks=-(-clmla.WARMUP_TOKENS // 64) + 1, config=layer)
    layer.warmup(big)
    assert big.info().sequences == 0
    m = layer.memory()
    assert m["q_a_proj"] > 0 and m["q_proj"] == 0 and m["biases"] > 0
    assert m["total"] == sum(v for k, v in m.items() if k != "total")
    n = layer.auto_threshold
    assert n >= 1
    # after a prefix long against the threshold, the threshold itself decides (n on CPUs, n + 1 on
    # other devices, whose rule counts the entry's own keys); this small shape's absorbed pairs cost
    # less than decompressed ones on CPUs: 1000000 there, which no entry reaches; one token is
    # always absorbed
    if n >= 1000000:
        assert layer.auto_path(1 << 20, 1 << 16) == "absorbed"
    else:
        assert layer.auto_path(1 << 20, n + 1) == "decompressed"
        if n * n < 1 << 20:
            assert layer.auto_path(1 << 20, n - 1) == "absorbed"
    assert layer.auto_path(10, 1) == "absorbed"
    with pytest.raises(clmla.Error, match="prefix"):
        layer.auto_path(-1, 4)
    assert "Layer" in repr(layer) and "Cache" in repr(big)


def test_noncontiguous_and_other_float_inputs(ctx):
    d = V2_SMALL
    w = random_weights(d)
    layer = clmla.Layer(config(d), {k: np.asfortranarray(v) for k, v in w.items()}, context=ctx)
    x = random_x(5, d["hidden_size"])
    y1, _, _ = run_sequence(layer, x, 5)
    y2, _, _ = run_sequence(layer, np.asfortranarray(x), 5)
    wide = np.zeros((5, 2 * d["hidden_size"]), np.float32)
    wide[:, ::2] = x
    y3, _, _ = run_sequence(layer, wide[:, ::2], 5)
    y4, _, _ = run_sequence(layer, x.astype(np.float64), 5)
    c5 = clmla.Cache(layer.context, blocks=1, config=layer)
    y5 = layer(x.tolist(), batch=[(c5.add(), 5)], cache=c5)
    for y in (y2, y3, y4, y5):
        np.testing.assert_array_equal(y1, y)


# ---- errors: refused with clmla.Error, never a crash ---------------------------------------------------------

def test_layer_creation_errors(ctx):
    d = V3_SMALL
    cfg = config(d)
    w = random_weights(d)

    def status(weights, c=cfg):
        with pytest.raises(clmla.Error) as e:
            clmla.Layer(c, weights, context=ctx)
        return e.value.status

    assert status({k: v for k, v in w.items() if k != "kv_b_proj"}) == "CLMLA_ERROR_MISSING_TENSOR"
    assert status(dict(w, kv_b_proj=w["kv_b_proj"][:-1])) == "CLMLA_ERROR_SHAPE_MISMATCH"
    assert status(dict(w, kv_b_proj=w["kv_b_proj"].astype(np.int32))) == "CLMLA_ERROR_INVALID_ARGUMENT"
    assert status(dict(w, kv_b_proj=w["kv_b_proj"][None])) == "CLMLA_ERROR_SHAPE_MISMATCH"
    assert status(dict(w, kv_b_proj=np.zeros((0, 32), np.float32))) == "CLMLA_ERROR_SHAPE_MISMATCH"
    assert status(dict(w, kv_b_proj="not an array")) == "CLMLA_ERROR_INVALID_ARGUMENT"
    assert status(dict(w, q_proj=np.zeros((96, 64), np.float32)))  # both q_proj and the LoRA
    assert status(dict(w, rotary_emb=w["o_proj"])) == "CLMLA_ERROR_INVALID_ARGUMENT"
    assert status(dict(w, o_proj=clmla.Weight(w["o_proj"], "fp8"))) == "CLMLA_ERROR_INVALID_ARGUMENT"
    assert status(dict(w, o_proj=clmla.Weight(w["o_proj"].view(np.uint8)[:, :64], "fp8"))) == \
        "CLMLA_ERROR_MISSING_TENSOR"
    assert status(dict(w, o_proj=clmla.Weight(w["o_proj"].view(np.uint8)[:, :64], "fp8",
                                              np.ones((3, 3), np.float32)))) == "CLMLA_ERROR_SHAPE_MISMATCH"
    assert status(dict(w, o_proj=clmla.Weight(w["o_proj"], "bf16"))) == "CLMLA_ERROR_INVALID_ARGUMENT"
    assert status(w, cfg.replace(qk_rope_head_dim=7)) == "CLMLA_ERROR_INVALID_CONFIG"
    assert status([1, 2, 3]) == "CLMLA_ERROR_INVALID_ARGUMENT"
    with pytest.raises(clmla.Error):
        clmla.Layer(dict(V3_SMALL), w, context=ctx)
    with pytest.raises(clmla.Error):
        clmla.Layer(cfg, w, context="ctx")


def test_forward_errors(ctx):
    d = V3_SMALL
    layer = clmla.Layer(config(d), random_weights(d), context=ctx)
    cache = clmla.Cache(ctx, blocks=2, block_tokens=4, config=layer)
    s = cache.add()
    x = random_x(3, 64)

    def status(*args, **kw):
        with pytest.raises(clmla.Error) as e:
            layer(*args, **kw)
        return e.value.status

    assert status(x, batch=[(s, 2)], cache=cache) == "CLMLA_ERROR_SHAPE_MISMATCH"  # batch sum != rows
    assert status(x[:, :60], batch=[(s, 3)], cache=cache) == "CLMLA_ERROR_SHAPE_MISMATCH"
    assert status(x[None], batch=[(s, 3)], cache=cache) == "CLMLA_ERROR_SHAPE_MISMATCH"
    assert status(x.astype(np.int32), batch=[(s, 3)], cache=cache) == "CLMLA_ERROR_INVALID_ARGUMENT"
    assert status(x, batch=[(s, 0), (s, 3)], cache=cache) == "CLMLA_ERROR_INVALID_ARGUMENT"
    assert status(x, batch=[(s, 1), (s, 2)], cache=cache) == "CLMLA_ERROR_INVALID_ARGUMENT"  # twice
    assert status(x, batch=[(s.id, 3)], cache=cache) == "CLMLA_ERROR_INVALID_ARGUMENT"
    assert status(x, batch=[(s, 3.0)], cache=cache) == "CLMLA_ERROR_INVALID_ARGUMENT"
    assert status(x, batch=[], cache=cache) == "CLMLA_ERROR_INVALID_ARGUMENT"
    assert status(x, batch=[(s, 3)], cache=cache, path="fast") == "CLMLA_ERROR_INVALID_ARGUMENT"
    assert status(x, batch=[(s, 3)], cache=cache, cache_layer=1) == "CLMLA_ERROR_INVALID_ARGUMENT"
    assert status(x, batch=[(s, 3)], cache=cache, out=np.empty((3, 64), np.float64)) == \
        "CLMLA_ERROR_INVALID_ARGUMENT"
    other = clmla.Cache(ctx, blocks=2, config=layer)
    o = other.add()
    assert status(x, batch=[(o, 3)], cache=cache) == "CLMLA_ERROR_INVALID_ARGUMENT"
    wrong = clmla.Cache(ctx, blocks=2, kv_lora_rank=16, rope_dim=8)
    assert status(x, batch=[(wrong.add(), 3)], cache=wrong) == "CLMLA_ERROR_SHAPE_MISMATCH"
    # the cache is full: refused, nothing changes
    layer(x, batch=[(s, 3)], cache=cache)
    assert status(random_x(6, 64), batch=[(s, 6)], cache=cache) == "CLMLA_ERROR_CACHE_FULL"
    assert s.length() == 3
    # a freed sequence
    s.free()
    assert status(x, batch=[(s, 3)], cache=cache) == "CLMLA_ERROR_UNKNOWN_SEQUENCE"
    for call in (s.free, lambda: s.reserve(1), s.length, s.fork, s.read, s.blocks, lambda: s.truncate(0), lambda: s.id):
        with pytest.raises(clmla.Error) as e:
            call()
        assert e.value.status == "CLMLA_ERROR_UNKNOWN_SEQUENCE"
    # the sequence id is reused by the next add: the old object stays freed
    s2 = cache.add()
    assert s.freed and not s2.freed
    with pytest.raises(clmla.Error) as e:
        s2.truncate(5)
    assert e.value.status == "CLMLA_ERROR_INVALID_ARGUMENT" and e.value.message
    with pytest.raises(clmla.Error):
        s2.read(start=1)
    with pytest.raises(clmla.Error):
        s2.reserve(-1)
    with pytest.raises(clmla.Error) as e:
        s2.reserve(1000)
    assert e.value.status == "CLMLA_ERROR_CACHE_FULL"


def test_cache_errors(ctx):
    with pytest.raises(clmla.Error):
        clmla.Cache(ctx, blocks=4)  # no rank
    with pytest.raises(clmla.Error):
        clmla.Cache(ctx, blocks=0, kv_lora_rank=32, rope_dim=8)
    with pytest.raises(clmla.Error):
        clmla.Cache(ctx, blocks=4, kv_lora_rank=32, rope_dim=8, dtype="f8")
    with pytest.raises(clmla.Error) as e:
        clmla.Cache(ctx, blocks=4, kv_lora_rank=32, rope_dim=8, dtype="fp8")  # rkv not a multiple of 128
    assert e.value.status != "CLMLA_SUCCESS"
    c = clmla.Cache(ctx, blocks=4, kv_lora_rank=128, rope_dim=8, dtype="fp8")
    assert c.info().bytes_per_token_per_layer == 128 + 4 + 16


def test_lifetimes(tmp_path):
    """Objects keep their context alive; closing a context closes its objects first; closed
    objects refuse every call."""
    d = V2_SMALL
    c = clmla.Context()
    layer = clmla.Layer(config(d), random_weights(d), context=c)
    cache = clmla.Cache(c, blocks=2, config=layer)
    s = cache.add()
    del c
    gc.collect()
    x = random_x(2, d["hidden_size"])
    layer(x, batch=[(s, 2)], cache=cache)  # the context is alive through the layer
    ctx2 = layer.context
    ctx2.close()
    assert layer.closed and cache.closed and ctx2.closed
    for call in (lambda: layer(x, batch=[(s, 2)], cache=cache), lambda: layer.memory(), lambda: cache.add(),
                 lambda: s.length(), lambda: cache.info(), lambda: ctx2.device, lambda: layer.warmup(cache),
                 lambda: clmla.Cache(ctx2, blocks=1, kv_lora_rank=8, rope_dim=2),
                 lambda: clmla.Layer(config(d), random_weights(d), context=ctx2)):
        with pytest.raises(clmla.Error):
            call()
    # context managers, and destroying in any order
    with clmla.Context() as c3:
        with clmla.Layer(config(d), random_weights(d), context=c3) as l3:
            cache3 = clmla.Cache(c3, blocks=1, config=l3)
        assert l3.closed
        cache3.add()
    assert cache3.closed
    c4 = clmla.Context()
    l4 = clmla.Layer(config(d), random_weights(d), context=c4)
    k4 = clmla.Cache(c4, blocks=1, config=l4)
    del l4, k4, c4
    gc.collect()


def test_default_context():
    c = clmla.default_context()
    assert c is clmla.default_context()
    layer = clmla.Layer(config(V2_SMALL), random_weights(V2_SMALL))
    assert layer.context is c
    cache = clmla.Cache(blocks=1, config=layer)
    assert cache.context is c


# ---- linear and latent attention alone -----------------------------------------------------------------------

def test_linear(ctx):
    rng = np.random.default_rng(0)
    W = rng.standard_normal((40, 24)).astype(np.float32)
    lin = clmla.Linear(W, context=ctx)
    for m in (1, 3, 9, 70):
        x = rng.standard_normal((m, 24)).astype(np.float32)
        assert rel_err(lin(x), x.astype(np.float64) @ W.T.astype(np.float64)) < 1e-5
    info = lin.info()
    assert info["n"] == 40 and info["k"] == 24 and info["device_bytes"] > 0
    with pytest.raises(clmla.Error):
        lin(np.zeros((2, 23), np.float32))
    with pytest.raises(clmla.Error):
        clmla.Linear(np.zeros((3,), np.float32), context=ctx)
    lin.close()
    # the GPU forms of the products on any device: row-major weights, the same results
    gctx = clmla.Context(ctx.device, product_kernels="group")
    glin = clmla.Linear(W, context=gctx)
    assert not glin.info()["packed"]
    for m in (1, 3, 9):
        x = rng.standard_normal((m, 24)).astype(np.float32)
        assert rel_err(glin(x), x.astype(np.float64) @ W.T.astype(np.float64)) < 1e-5
    glin.close()
    gctx.close()
    with pytest.raises(clmla.Error):
        lin(np.zeros((1, 24), np.float32))


def test_latent_attention(ctx):
    """Rows appended from host arrays, attended by absorbed queries: against numpy float64."""
    rng = np.random.default_rng(1)
    rkv, dr, H = 32, 8, 3
    cache = clmla.Cache(ctx, layers=2, blocks=8, block_tokens=4, kv_lora_rank=rkv, rope_dim=dr)
    a, b = cache.add(), cache.add()
    ca, ka = rng.standard_normal((10, rkv)).astype(np.float32), rng.standard_normal((10, dr)).astype(np.float32)
    cb, kb = rng.standard_normal((5, rkv)).astype(np.float32), rng.standard_normal((5, dr)).astype(np.float32)
    a.append(ca[:6], ka[:6], layer=1)
    b.append(cb, kb, layer=1)
    a.append(ca[6:], ka[6:], layer=1)
    assert a.length(1) == 10 and a.length(0) == 0
    c, k = a.read(layer=1)
    np.testing.assert_array_equal(c, ca)
    np.testing.assert_array_equal(k, ka)
    seqs = [a, a, b, a]
    lens = [10, 3, 5, 0]
    ql = rng.standard_normal((4, H, rkv)).astype(np.float32)
    qr = rng.standard_normal((4, H, dr)).astype(np.float32)
    tau = 0.3
    out, lse = clmla.latent_attention(cache, ql, qr, seqs, lens, tau, layer=1, return_lse=True)
    assert out.shape == (4, H, rkv) and lse.shape == (4, H)
    rows = {id(a): (ca, ka), id(b): (cb, kb)}
    for t, (s, n) in enumerate(zip(seqs, lens)):
        C, K = (r.astype(np.float64) for r in rows[id(s)])
        for h in range(H):
            if n == 0:
                assert np.all(out[t, h] == 0) and lse[t, h] == -np.inf
                continue
            sc = tau * (C[:n] @ ql[t, h] + K[:n] @ qr[t, h])
            p = np.exp(sc - sc.max())
            assert abs(lse[t, h] - (sc.max() + np.log(p.sum()))) < 1e-5
            assert rel_err(out[t, h], (p / p.sum()) @ C[:n]) < 1e-5
    with pytest.raises(clmla.Error):
        clmla.latent_attention(cache, ql, qr, seqs, [11, 3, 5, 0], tau, layer=1)  # past the sequence
    with pytest.raises(clmla.Error):
        clmla.latent_attention(cache, ql[:, :, :8], qr, seqs, lens, tau, layer=1)
    with pytest.raises(clmla.Error):
        clmla.latent_attention(cache, ql, qr, seqs[:3], lens, tau, layer=1)
    with pytest.raises(clmla.Error):
        clmla.latent_attention(cache, ql, qr, seqs, lens, float("nan"), layer=1)
    with pytest.raises(clmla.Error):
        clmla.latent_attention(cache, ql, qr, seqs, lens, tau, layer=2)
    # sparse: each token's own positions (a subset in any order, -1 padding, one past its length)
    idx = np.array([[7, 0, 3, -1, 9], [2, -1, -1, -1, 5], [4, 1, 1, -1, -1], [0, 1, -1, -1, -1]], np.int64)
    out_s, lse_s = clmla.latent_attention(cache, ql, qr, seqs, lens, tau, layer=1, return_lse=True, indices=idx)
    for t, (s, n) in enumerate(zip(seqs, lens)):
        C, K = (r.astype(np.float64) for r in rows[id(s)])
        sel = [int(i) for i in idx[t] if 0 <= i < n]  # duplicates count twice
        for h in range(H):
            if not sel:
                assert np.all(out_s[t, h] == 0) and lse_s[t, h] == -np.inf
                continue
            sc = tau * (C[sel] @ ql[t, h] + K[sel] @ qr[t, h])
            p = np.exp(sc - sc.max())
            assert abs(lse_s[t, h] - (sc.max() + np.log(p.sum()))) < 1e-5
            assert rel_err(out_s[t, h], (p / p.sum()) @ C[sel]) < 1e-5
    every = np.array([list(range(9, -1, -1)) + [-1]] * 4)  # all positions, reversed: the dense result
    np.testing.assert_allclose(clmla.latent_attention(cache, ql, qr, seqs, lens, tau, layer=1, indices=every), out,
                               rtol=1e-5, atol=1e-6)
    with pytest.raises(clmla.Error):
        clmla.latent_attention(cache, ql, qr, seqs, lens, tau, layer=1, indices=idx[:3])
    with pytest.raises(clmla.Error):
        clmla.latent_attention(cache, ql, qr, seqs, lens, tau, layer=1, indices=idx.astype(np.float32))
    with pytest.raises(clmla.Error):
        a.append(ca[:, :8], ka)
    with pytest.raises(clmla.Error):
        a.append(ca[:2], ka[:3])


# ---- the rest of the C API through the raw binding -------------------------------------------------------------

def test_raw_binding_calls(ctx, tmp_path):
    b = clmla.binding
    lib, S, K = b.lib, b.STRUCTS, b.CONST
    assert lib.clmla_status_string(K["CLMLA_ERROR_CACHE_FULL"]) == b"CLMLA_ERROR_CACHE_FULL"
    assert lib.clmla_device_kind_name(K["CLMLA_DEVICE_KIND_GPU"]) == b"gpu"
    assert lib.clmla_dtype_name(K["CLMLA_DTYPE_BF16"]) == b"bf16"
    assert lib.clmla_weights_dtype_held(K["CLMLA_WEIGHTS_F16"], K["CLMLA_DTYPE_F32"]) == K["CLMLA_DTYPE_F16"]
    assert lib.clmla_preset_name(K["CLMLA_PRESET_DEEPSEEK_V3"]) == b"v3"
    names = [lib.clmla_xgemm_parameter_name(i) for i in range(K["CLMLA_XGEMM_PARAMETERS"])]
    assert names[0] == b"GEMMK" and lib.clmla_xgemm_parameter_name(16) is None
    # latent tuning
    t = S["clmla_latent_tuning"]()
    lib.clmla_latent_tuning_defaults(ctypes.byref(t))
    why = ctypes.c_char_p()
    assert lib.clmla_latent_tuning_check(ctypes.byref(t), ctypes.byref(why)) == 0
    t.rows_heads = 3
    assert lib.clmla_latent_tuning_check(ctypes.byref(t), ctypes.byref(why)) == K["CLMLA_ERROR_INVALID_ARGUMENT"]
    assert why.value
    lib.clmla_latent_tuning_defaults(ctypes.byref(t))
    info = S["clmla_device_info"]()
    assert lib.clmla_context_device(ctx._handle, ctypes.byref(info)) == 0
    src = ctypes.c_char_p()
    t2 = S["clmla_latent_tuning"]()
    assert lib.clmla_latent_tuning_lookup(ctypes.byref(info), 4, ctypes.byref(t2), ctypes.byref(src)) in (
        0, K["CLMLA_ERROR_INVALID_FILE"])
    assert src.value
    buf = ctypes.create_string_buffer(4096)
    assert lib.clmla_latent_tuning_path(buf, 4096) == 0
    assert lib.clmla_xgemm_tuning_path(buf, 4096) == 0
    path = str(tmp_path / "kt.json").encode()
    assert lib.clmla_latent_tuning_save(path, ctypes.byref(info), 4, ctypes.byref(t), b"test") == 0
    assert lib.clmla_context_set_latent_tuning(ctx._handle, ctypes.byref(t)) == 0
    assert lib.clmla_context_set_latent_tuning(ctx._handle, None) == 0
    # product tuning: the same calls, keyed by K's class
    pt = S["clmla_product_tuning"]()
    lib.clmla_product_tuning_defaults(ctypes.byref(pt))
    assert lib.clmla_product_tuning_check(ctypes.byref(pt), ctypes.byref(why)) == 0
    pt.skinny_items = 3
    assert lib.clmla_product_tuning_check(ctypes.byref(pt), ctypes.byref(why)) == K["CLMLA_ERROR_INVALID_ARGUMENT"]
    assert b"skinny_items" in why.value
    lib.clmla_product_tuning_defaults(ctypes.byref(pt))
    pt2 = S["clmla_product_tuning"]()
    assert lib.clmla_product_tuning_lookup(ctypes.byref(info), 2048, ctypes.byref(pt2), ctypes.byref(src)) in (
        0, K["CLMLA_ERROR_INVALID_FILE"])
    assert src.value
    assert lib.clmla_product_tuning_save(path, ctypes.byref(info), 2048, ctypes.byref(pt), b"test") == 0
    assert "products" in open(path, encoding="utf-8").read()  # beside the latent entry saved above
    assert lib.clmla_context_set_product_tuning(ctx._handle, ctypes.byref(pt)) == 0
    assert lib.clmla_context_set_product_tuning(ctx._handle, None) == 0
    # CLBlast tuning entries
    xt = S["clmla_xgemm_tuning"]()
    rc = lib.clmla_context_xgemm_tuning(ctx._handle, ctypes.byref(xt), ctypes.byref(src))
    assert rc in (0, K["CLMLA_ERROR_UNSUPPORTED"]) and src.value
    if rc == 0:
        assert lib.clmla_xgemm_values_check(ctx._handle, xt.values, ctypes.byref(why)) == 0
        assert lib.clmla_xgemm_tuning_save(str(tmp_path / "cb.json").encode(), ctypes.byref(xt)) == 0
    bad = (ctypes.c_size_t * 16)(*([0] * 16))
    assert lib.clmla_xgemm_values_check(ctx._handle, bad, ctypes.byref(why)) == K["CLMLA_ERROR_INVALID_ARGUMENT"]
    # tune options exist (the search itself takes minutes: not run here)
    assert S["clmla_tune_options"]().max_candidates == 0
    assert callable(lib.clmla_tune_xgemm)
    # the kernel searches: refusals of bad options, naming the field (a search itself takes seconds to minutes)
    ko = S["clmla_kernel_tune_options"]()
    lr, pr = S["clmla_latent_tune_result"](), S["clmla_product_tune_result"]()
    ko.heads = 2000
    assert lib.clmla_tune_latent(ctx._handle, ctypes.byref(ko), ctypes.byref(lr)) == K["CLMLA_ERROR_INVALID_ARGUMENT"]
    assert b"heads" in lib.clmla_last_error(ctx._handle)
    ko.heads = 64
    assert lib.clmla_tune_prefill(ctx._handle, ctypes.byref(ko), ctypes.byref(lr)) == K["CLMLA_ERROR_INVALID_ARGUMENT"]
    assert b"heads" in lib.clmla_last_error(ctx._handle)
    ko.heads = 0
    assert lib.clmla_tune_products(ctx._handle, ctypes.byref(ko), 0, ctypes.byref(pr)) == K["CLMLA_ERROR_INVALID_ARGUMENT"]
    assert b"k must be" in lib.clmla_last_error(ctx._handle)
    # npy files
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    shape = (ctypes.c_int64 * 2)(3, 4)
    p = str(tmp_path / "a.npy").encode()
    assert lib.clmla_npy_write_f32(p, a.ctypes.data_as(ctypes.POINTER(ctypes.c_float)), 2, shape) == 0
    np.testing.assert_array_equal(np.load(p.decode()), a)
    data = ctypes.POINTER(ctypes.c_float)()
    shp = (ctypes.c_int64 * 2)()
    nd = ctypes.c_int()
    assert lib.clmla_npy_read_f32(p, ctypes.byref(data), shp, ctypes.byref(nd)) == 0
    assert nd.value == 2 and list(shp) == [3, 4] and data[11] == 11.0
    lib.clmla_free(ctypes.cast(data, ctypes.c_void_p))
    # numpy's default dtype, float64, as np.save writes it: read rounded to float32
    d = np.linspace(-3.0, 5.0, 10).reshape(2, 5) + 1e-9
    pd = str(tmp_path / "d.npy").encode()
    np.save(pd.decode(), d)
    assert lib.clmla_npy_read_f32(pd, ctypes.byref(data), shp, ctypes.byref(nd)) == 0
    assert nd.value == 2 and list(shp) == [2, 5]
    np.testing.assert_array_equal(np.ctypeslib.as_array(data, (10,)), d.astype(np.float32).reshape(-1))
    lib.clmla_free(ctypes.cast(data, ctypes.c_void_p))
    assert lib.clmla_npy_read_f32(str(tmp_path / "none.npy").encode(), ctypes.byref(data), shp,
                                  ctypes.byref(nd)) != 0
    assert lib.clmla_last_error(None)
    # tensor descriptors
    t2d = lib.clmla_tensor_2d(a.ctypes.data_as(ctypes.POINTER(ctypes.c_float)), 3, 4)
    assert t2d.ndim == 2 and list(t2d.shape) == [3, 4] and t2d.dtype == 0
    t1d = lib.clmla_tensor_1d(a.ctypes.data_as(ctypes.POINTER(ctypes.c_float)), 12)
    assert t1d.ndim == 1 and t1d.shape[0] == 12
    # contexts from a caller's queue
    h = ctypes.c_void_p()
    assert lib.clmla_context_create_from_queue(ctx.queue, ctypes.byref(h)) == 0
    lib.clmla_context_destroy(h)
    assert lib.clmla_context_create_from_queue_opts(ctx.queue, None, ctypes.byref(h)) == 0
    lib.clmla_context_destroy(h)
    assert lib.clmla_context_create(b"0", ctypes.byref(h)) == 0
    lib.clmla_context_destroy(h)
    # the rest of the layer calls, raw
    lw = clmla.Layer(config(V2_SMALL), random_weights(V2_SMALL), context=ctx)
    cache = clmla.Cache(ctx, blocks=2, config=lw)
    s = cache.add()
    x = random_x(2, V2_SMALL["hidden_size"])
    out = np.empty_like(x)
    with clmla._cl.Buffers(ctx.cl_context, ctx.queue, clmla._core._fail) as bufs:
        xm, om = bufs.upload(x), bufs.empty(out.nbytes)
        e = (S["clmla_batch_entry"] * 1)()
        e[0].seq_id, e[0].num_tokens = s.id, 2
        args = S["clmla_forward_args"]()
        args.entries, args.num_entries = e, 1
        assert lib.clmla_layer_forward_cl(lw._handle, cache._handle, ctypes.byref(args), xm, 0, om, 0, None) == 0
        bufs.finish()
        bufs.download(om, out)
    ref = reference.mla_forward(V2_SMALL, random_weights(V2_SMALL), x)
    assert rel_err(out, ref) < 1e-5
    # clmla_linear_forward_cl and clmla_linear_device_bytes
    W = np.eye(4, dtype=np.float32) * 2
    lin = clmla.Linear(W, context=ctx)
    nbytes = ctypes.c_size_t()
    assert lib.clmla_linear_device_bytes(lin._handle, ctypes.byref(nbytes)) == 0 and nbytes.value > 0
    with clmla._cl.Buffers(ctx.cl_context, ctx.queue, clmla._core._fail) as bufs:
        xv = np.ones((2, 4), np.float32)
        xm, ym = bufs.upload(xv), bufs.empty(32)
        assert lib.clmla_linear_forward_cl(lin._handle, 2, xm, 0, ym, 0, None) == 0
        y = bufs.download(ym, np.empty((2, 4), np.float32))
    np.testing.assert_array_equal(y, 2 * xv)
    # a layer from a model folder without options (tested further in test_model.py)
    assert callable(lib.clmla_layer_create_from_model)


# ---- loading, and the module's command line --------------------------------------------------------------------

def test_import_errors(tmp_path):
    """A missing libclmla or system library is an ImportError that names it."""
    import os
    import subprocess
    import sys
    env = dict(os.environ, CLMLA_LIBRARY=str(tmp_path / "libclmla.so"))
    r = subprocess.run([sys.executable, "-c", "import clmla"], capture_output=True, text=True, env=env)
    assert r.returncode != 0 and "ImportError" in r.stderr and "libclmla.so" in r.stderr
    from clmla._binding import _missing_system_library
    m = _missing_system_library("libclblast.so.1: cannot open shared object file: No such file or directory")
    assert "libclblast.so.1" in m and "apt-get install libclblast1" in m
    m = _missing_system_library("libcjson.so.1: cannot open shared object file")
    assert "libcjson1" in m
    m = _missing_system_library("libOpenCL.so.1: cannot open shared object file")
    assert "ocl-icd-libopencl1" in m


def test_module_commands():
    import json
    import subprocess
    import sys
    r = subprocess.run([sys.executable, "-m", "clmla", "devices"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "P:D" in r.stdout and "*" in r.stdout, r.stderr
    r = subprocess.run([sys.executable, "-m", "clmla", "devices", "--json"], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0 and json.loads(r.stdout)[0]["name"] == clmla.devices()[0].name
    r = subprocess.run([sys.executable, "-m", "clmla", "demo", "--prefill", "40", "--decode", "3"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    for word in ("prefill", "decode", "kv cache", "check", "OK"):
        assert word in r.stdout
    # an fp8 cache, checked against the reference's own fp8 rounding of the cache
    r = subprocess.run([sys.executable, "-m", "clmla", "demo", "--prefill", "40", "--decode", "3", "--cache-dtype",
                        "fp8"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and "656 bytes/token/layer" in r.stdout and ": OK" in r.stdout, r.stdout + r.stderr
    r = subprocess.run([sys.executable, "-m", "clmla", "demo", "--device", "no-such-device"], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 1 and "CLMLA_ERROR_DEVICE_NOT_FOUND" in r.stderr
    r = subprocess.run([sys.executable, "-m", "clmla", "frobnicate"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "usage" in r.stderr


def test_latent_attention_query_len(ctx):
    """Two new tokens per sequence (multi-token decode): the same output as tokens on their own;
    a query_len that does not divide the tokens is refused by name."""
    rng = np.random.default_rng(3)
    rkv, dr, H = 32, 8, 2
    cache = clmla.Cache(ctx, blocks=8, block_tokens=4, kv_lora_rank=rkv, rope_dim=dr)
    a, b = cache.add(), cache.add()
    a.append(rng.standard_normal((10, rkv)).astype(np.float32), rng.standard_normal((10, dr)).astype(np.float32))
    b.append(rng.standard_normal((5, rkv)).astype(np.float32), rng.standard_normal((5, dr)).astype(np.float32))
    ql = rng.standard_normal((4, H, rkv)).astype(np.float32)
    qr = rng.standard_normal((4, H, dr)).astype(np.float32)
    seqs, lens = [a, a, b, b], [9, 10, 4, 5]
    alone = clmla.latent_attention(cache, ql, qr, seqs, lens, 0.3)
    folded = clmla.latent_attention(cache, ql, qr, seqs, lens, 0.3, query_len=2)
    np.testing.assert_allclose(folded, alone, rtol=1e-5, atol=1e-6)
    # the work-group kernels on any device: there the two tokens of a sequence share a group
    gctx = clmla.Context(ctx.device, attention_kernels="group")
    gcache = clmla.Cache(gctx, blocks=8, block_tokens=4, kv_lora_rank=rkv, rope_dim=dr)
    ga, gb = gcache.add(), gcache.add()
    for src, dst in ((a, ga), (b, gb)):
        dst.append(*src.read())
    np.testing.assert_allclose(clmla.latent_attention(gcache, ql, qr, [ga, ga, gb, gb], lens, 0.3, query_len=2), alone,
                               rtol=1e-5, atol=1e-6)
    with pytest.raises(clmla.Error, match="attention kernels 'gpu'"):
        clmla.Context(ctx.device, attention_kernels="gpu")
    with pytest.raises(clmla.Error, match="product kernels 'gpu'"):
        clmla.Context(ctx.device, product_kernels="gpu")
    with pytest.raises(clmla.Error, match="query_len"):
        clmla.latent_attention(cache, ql, qr, seqs, lens, 0.3, query_len=3)


def test_latent_attention_no_keys(ctx):
    cache = clmla.Cache(ctx, blocks=2, block_tokens=4, kv_lora_rank=16, rope_dim=4)
    s = cache.add()
    out, lse = clmla.latent_attention(cache, np.ones((2, 2, 16), np.float32), np.ones((2, 2, 4), np.float32),
                                      [s, s], [0, 0], 0.5, return_lse=True)
    assert np.all(out == 0) and np.all(lse == -np.inf)


def test_context_trace(ctx, tmp_path):
    # Context(trace=...): every command of the context in the file by its close, with device timestamps
    path = tmp_path / "trace.tsv"
    tctx = clmla.Context(ctx.device, trace=str(path))
    W = np.arange(12, dtype=np.float32).reshape(3, 4)
    lin = clmla.Linear(W, context=tctx)
    for _ in range(3):
        np.testing.assert_allclose(lin(np.ones((1, 4), np.float32)), [[6, 22, 38]], rtol=1e-6)
    tctx.close()
    rows = [line.split("\t") for line in path.read_text().splitlines() if not line.startswith("#")]
    assert [r[1] for r in rows].count("read") == 3 and any(r[1] == "kernel" for r in rows)
    for r in rows:
        assert len(r) == 8 and int(r[4]) <= int(r[5]) <= int(r[6]) <= int(r[7])
    with pytest.raises(clmla.Error, match="trace must be a string"):
        clmla.Context(ctx.device, trace=3)
