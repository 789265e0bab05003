"""Model folders written with numpy alone (config.json + safetensors): loaded by the binding, run
through the C command line (`clmla run`, path in CLMLA_CLI) and through Python with identical
outputs, against the float64 reference, and as tensor-parallel shards whose sum is the layer."""

import os
import shutil
import subprocess

import numpy as np
import pytest

import clmla
from clmla import reference

from conftest import REPO, V2_SMALL, V3_SMALL, random_x, rel_err, run_sequence, write_model


def find_cli():
    p = os.environ.get("CLMLA_CLI")
    if p:
        return p if os.path.exists(p) else None
    for cand in (os.path.join(REPO, "build", "clmla"),):
        if os.path.exists(cand):
            return cand
    return None


@pytest.fixture(scope="module")
def v3_folder(tmp_path_factory):
    d = tmp_path_factory.mktemp("v3model")
    weights = write_model(str(d), V3_SMALL, num_layers=3, seed=5, bias=True)
    return str(d), weights


@pytest.fixture(scope="module")
def v2_folder(tmp_path_factory):
    d = tmp_path_factory.mktemp("v2model")
    weights = write_model(str(d), V2_SMALL, num_layers=2, seed=8, model_type="deepseek_v2")
    return str(d), weights


def test_from_pretrained_matches_reference(ctx, v3_folder, v2_folder):
    for (folder, weights), d in ((v3_folder, V3_SMALL), (v2_folder, V2_SMALL)):
        cfg = clmla.LayerConfig.from_pretrained(folder)
        assert (cfg.hidden_size, cfg.num_heads, cfg.q_lora_rank) == (d["hidden_size"], d["num_heads"],
                                                                      d["q_lora_rank"])
        layer = clmla.Layer.from_pretrained(folder, layer=1, context=ctx)
        x = random_x(11, d["hidden_size"], seed=4)
        y, _, _ = run_sequence(layer, x, 5)
        assert rel_err(y, reference.mla_forward(d, weights[1], x)) < 1e-5
        assert layer.config.kv_lora_rank == d["kv_lora_rank"]


def test_from_pretrained_weights_dtype(ctx, v3_folder):
    folder, weights = v3_folder
    layer = clmla.Layer.from_pretrained(folder, layer=2, weights_dtype="f16", context=ctx)
    assert layer.config.weights_dtype == "f16"
    x = random_x(6, 64)
    y, _, _ = run_sequence(layer, x, 3)
    w16 = {k: v.astype(np.float16) if v.ndim == 2 else v for k, v in weights[2].items()}
    assert rel_err(y, reference.mla_forward(V3_SMALL, w16, x)) < 1e-5


def test_from_pretrained_errors(ctx, v3_folder, tmp_path):
    folder, _ = v3_folder
    for kw, status in ((dict(layer=3), None), (dict(layer=-1), "CLMLA_ERROR_INVALID_ARGUMENT"),
                       (dict(weights_dtype="f12"), "CLMLA_ERROR_INVALID_ARGUMENT"),
                       (dict(sublayer=1), None)):
        with pytest.raises(clmla.Error) as e:
            clmla.Layer.from_pretrained(folder, context=ctx, **kw)
        if status:
            assert e.value.status == status
        assert e.value.message
    with pytest.raises(clmla.Error) as e:
        clmla.Layer.from_pretrained(str(tmp_path / "nothing"), context=ctx)
    assert e.value.status in ("CLMLA_ERROR_IO", "CLMLA_ERROR_INVALID_FILE")
    with pytest.raises(clmla.Error):
        clmla.LayerConfig.from_pretrained(str(tmp_path / "nothing"))
    # a truncated safetensors file is refused, not read past its end
    bad = tmp_path / "bad"
    shutil.copytree(folder, bad)
    st = bad / "model.safetensors"
    st.write_bytes(st.read_bytes()[:-100])
    with pytest.raises(clmla.Error) as e:
        clmla.Layer.from_pretrained(str(bad), context=ctx)
    assert e.value.status == "CLMLA_ERROR_INVALID_FILE"


def test_raw_create_from_model(ctx, v2_folder):
    import ctypes
    lib = clmla.binding.lib
    h = ctypes.c_void_p()
    assert lib.clmla_layer_create_from_model(ctx._handle, v2_folder[0].encode(), 1, ctypes.byref(h)) == 0
    lib.clmla_layer_destroy(h)


@pytest.mark.parametrize("case", [
    dict(name="v3", layer=1, P=5, T=11, extra=[]),
    dict(name="v3-chunks-decompressed", layer=2, P=9, T=12, extra=["--chunk", "4", "--path", "decompressed"]),
    dict(name="v2-f16-blocks", layer=0, P=4, T=9, extra=["--cache-dtype", "f16", "--block-size", "4"]),
])
def test_cli_and_python_identical(ctx, v3_folder, v2_folder, tmp_path, case):
    """The same folder through `clmla run` and through the binding gives bit-identical outputs."""
    cli = find_cli()
    if not cli:
        pytest.skip("the clmla command was not found: set CLMLA_CLI=/path/to/build/clmla")
    folder, weights = v2_folder if case["name"].startswith("v2") else v3_folder
    d = V2_SMALL if case["name"].startswith("v2") else V3_SMALL
    T, P = case["T"], case["P"]
    x = random_x(T, d["hidden_size"], seed=31)
    np.save(tmp_path / "X.npy", x)
    cmd = [cli, "run", "--model", folder, "--layer", str(case["layer"]), "--input", str(tmp_path / "X.npy"),
           "--output", str(tmp_path / "Y.npy"), "--prefill", str(P)] + case["extra"]
    if os.environ.get("CLMLA_DEVICE"):
        cmd += ["--device", os.environ["CLMLA_DEVICE"]]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr + r.stdout
    y_cli = np.load(tmp_path / "Y.npy")
    opts = dict(zip(case["extra"][::2], case["extra"][1::2]))
    chunk = int(opts.get("--chunk", P))
    layer = clmla.Layer.from_pretrained(folder, layer=case["layer"], context=ctx)
    bt = int(opts.get("--block-size", 64))
    cache = clmla.Cache(ctx, blocks=-(-T // bt), block_tokens=bt, dtype=opts.get("--cache-dtype", "f32"),
                        config=layer)
    seq = cache.add()
    y = np.empty_like(x)
    t = 0
    while t < T:
        n = min(chunk, P - t) if t < P else 1
        y[t:t + n] = layer(x[t:t + n], batch=[(seq, n)], cache=cache, path=opts.get("--path", "auto"))
        t += n
    np.testing.assert_array_equal(y, y_cli)
    ref = reference.mla_forward(d, weights[case["layer"]], x, cache_dtype=opts.get("--cache-dtype", "f32"))
    assert rel_err(y, ref) < 1e-4


# ---- tensor-parallel shards -------------------------------------------------------------------------------------

def _tp_supported(ctx, folder):
    try:
        layer = clmla.Layer.from_pretrained(folder, layer=0, tp_rank=1, tp_size=2, context=ctx)
    except clmla.Error as e:
        return "libclmla refused a shard: %s" % e
    if layer.config.tp_size != 2:
        return "this libclmla does not implement tensor-parallel shards yet (tp_size is not kept)"
    return None


@pytest.mark.parametrize("tp_size", [2, 4])
def test_tp_shards_sum_to_layer(ctx, v3_folder, tp_size):
    """Each shard holds its heads; the sum of the shards' outputs is the whole layer's (o_proj's
    bias added by rank 0 only), from a folder and from host arrays (full or pre-sliced)."""
    folder, weights = v3_folder
    why = _tp_supported(ctx, folder)
    if why:
        pytest.skip(why)
    x = random_x(9, 64, seed=12)
    whole, _, _ = run_sequence(clmla.Layer.from_pretrained(folder, layer=1, context=ctx), x, 4)
    d, w = V3_SMALL, weights[1]
    H, dn, dr, dv = d["num_heads"], d["qk_nope_head_dim"], d["qk_rope_head_dim"], d["v_head_dim"]
    Hs = H // tp_size
    parts, parts_arrays, parts_sliced = [], [], []
    for r in range(tp_size):
        shard = clmla.Layer.from_pretrained(folder, layer=1, tp_rank=r, tp_size=tp_size, context=ctx)
        assert shard.config.tp_rank == r and shard.config.tp_size == tp_size
        full = clmla.Layer.from_pretrained(folder, layer=1, context=ctx)
        assert shard.memory()["kv_b_proj"] < full.memory()["kv_b_proj"]
        y, _, _ = run_sequence(shard, x, 4)
        parts.append(y)
        ref = reference.mla_forward(d, w, x, heads=range(r * Hs, (r + 1) * Hs))
        assert rel_err(y, ref) < 1e-5
        cfg = clmla.LayerConfig(**d)
        y2, _, _ = run_sequence(clmla.Layer(cfg, w, tp_rank=r, tp_size=tp_size, context=ctx), x, 4)
        parts_arrays.append(y2)
        sl = dict(w)
        sl["q_b_proj"] = w["q_b_proj"].reshape(H, dn + dr, -1)[r * Hs:(r + 1) * Hs].reshape(Hs * (dn + dr), -1)
        sl["kv_b_proj"] = w["kv_b_proj"].reshape(H, dn + dv, -1)[r * Hs:(r + 1) * Hs].reshape(Hs * (dn + dv), -1)
        sl["o_proj"] = np.ascontiguousarray(w["o_proj"][:, r * Hs * dv:(r + 1) * Hs * dv])
        y3, _, _ = run_sequence(clmla.Layer(cfg, sl, tp_rank=r, tp_size=tp_size, context=ctx), x, 4)
        parts_sliced.append(y3)
    total = np.sum(np.array(parts, np.float64), axis=0)
    assert rel_err(total, whole) < 1e-5
    assert rel_err(total, reference.mla_forward(d, w, x)) < 1e-5
    np.testing.assert_allclose(np.sum(parts_arrays, axis=0), total, rtol=0, atol=1e-5 * np.abs(total).max())
    np.testing.assert_allclose(np.sum(parts_sliced, axis=0), total, rtol=0, atol=1e-5 * np.abs(total).max())


def test_tp_errors(ctx, v3_folder):
    folder, weights = v3_folder
    why = _tp_supported(ctx, folder)
    if why:
        pytest.skip(why)
    with pytest.raises(clmla.Error) as e:
        clmla.Layer.from_pretrained(folder, layer=1, tp_rank=0, tp_size=3, context=ctx)
    assert "3" in e.value.message and "4" in e.value.message  # names both numbers
    for r, n in ((2, 2), (-1, 2)):
        with pytest.raises(clmla.Error):
            clmla.Layer.from_pretrained(folder, layer=1, tp_rank=r, tp_size=n, context=ctx)
    cfg = clmla.LayerConfig(**V3_SMALL)
    with pytest.raises(clmla.Error) as e:
        clmla.Layer(cfg, weights[1], tp_rank=0, tp_size=3, context=ctx)
    assert "3" in e.value.message and "4" in e.value.message
    bad = dict(weights[1], kv_b_proj=weights[1]["kv_b_proj"][:8])
    with pytest.raises(clmla.Error) as e:
        clmla.Layer(cfg, bad, tp_rank=0, tp_size=2, context=ctx)
    assert e.value.status == "CLMLA_ERROR_SHAPE_MISMATCH"


SPARSE_FIXTURES = os.path.join(REPO, "tests", "fixtures", "parity")


@pytest.mark.parametrize("name", ["deepseek_v32-sparse.params", "glm_moe_dsa-sparse.legacy"])
def test_sparse_attention_fixture(ctx, name):
    """A DSA model past index_topk (its indexer selects): transformers' float64 output (the parity
    fixture) within float32 error; the cache holds the index keys; dense=True attends to every key
    and is far from it, so the selection did the work."""
    folder = os.path.join(SPARSE_FIXTURES, name)
    if not os.path.isdir(folder):
        pytest.skip("no parity fixture %s" % name)
    import json
    case = json.load(open(os.path.join(folder, "case.json")))
    x = np.load(os.path.join(folder, "X.npy"))
    want = np.load(os.path.join(folder, "Y.npy"))
    layer = clmla.Layer.from_pretrained(folder, layer=case["layer"], context=ctx)
    cfg = layer.config
    assert cfg.index_n_heads > 0 and cfg.index_topk < x.shape[0], cfg
    y, cache, seq = run_sequence(layer, x, case["prefill"], block_tokens=4, blocks=8)
    assert rel_err(y, want) <= 1e-5
    keys = seq.read_index()
    assert keys.shape == (x.shape[0], cfg.index_head_dim) and np.all(np.isfinite(keys)) and np.any(keys != 0)
    assert cache.info().index_bytes_per_token_per_layer == 4 * cfg.index_head_dim
    dense = clmla.Layer.from_pretrained(folder, layer=case["layer"], dense=True, context=ctx)
    assert dense.config.index_n_heads == 0
    yd, _, _ = run_sequence(dense, x, case["prefill"], block_tokens=4, blocks=8)
    assert rel_err(yd, want) > 1e-2


def test_index_select_matches_numpy(ctx):
    """clmla.index_select over index keys the layer wrote (a fixture's DSA layer): the positions of
    the top_k largest numpy float64 scores, ascending, -1 padded past the context; latent_attention
    then takes them. A cache without index keys is refused."""
    folder = os.path.join(SPARSE_FIXTURES, "deepseek_v32-sparse.params")
    if not os.path.isdir(folder):
        pytest.skip("no parity fixture")
    x = np.load(os.path.join(folder, "X.npy"))
    layer = clmla.Layer.from_pretrained(folder, layer=1, context=ctx)
    _, cache, seq = run_sequence(layer, x, 6, block_tokens=4, blocks=8)
    keys = seq.read_index().astype(np.float64)
    assert cache.index_buffer() != 0
    rng = np.random.default_rng(3)
    T, HI, dI, k = 3, 4, keys.shape[1], 5
    q = rng.standard_normal((T, HI, dI)).astype(np.float32)
    w = rng.standard_normal((T, HI)).astype(np.float32)
    lens = [13, 4, 9]
    got = clmla.index_select(cache, q, w, [seq] * T, lens, k)
    for t in range(T):
        s = (w[t, :, None] * np.maximum(q[t].astype(np.float64) @ keys[: lens[t]].T, 0)).sum(0)
        want = sorted(np.argsort(-s, kind="stable")[:k].tolist())
        assert got[t, : len(want)].tolist() == want and (got[t, len(want):] == -1).all(), (t, got[t], want)
    plain = clmla.Cache(ctx, blocks=4, config=clmla.Layer.from_pretrained(folder, layer=1, dense=True, context=ctx))
    s2 = plain.add()
    with pytest.raises(clmla.Error):
        clmla.index_select(plain, q, w, [s2] * T, [0, 0, 0], k)
