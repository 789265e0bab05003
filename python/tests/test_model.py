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


# ---- a model's layers over one cache (clmla.Model): glm_moe_dsa's full and shared layers ------------------------

DSA_TYPES = ["full", "shared", "shared", "full"]


@pytest.fixture(scope="module")
def dsa_folder(tmp_path_factory):
    """A glm_moe_dsa folder of 4 layers, full and shared, with index_topk 4 (numpy alone)."""
    import json
    from conftest import config_json, random_weights, write_safetensors
    d = str(tmp_path_factory.mktemp("dsamodel"))
    cfg = dict(V3_SMALL, yarn_factor=0)
    c = config_json(cfg, len(DSA_TYPES), "glm_moe_dsa")
    c.update(index_n_heads=8, index_head_dim=16, index_topk=4, indexer_types=DSA_TYPES)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(c, f)
    rng = np.random.default_rng(3)
    tensors = {}
    for i, kind in enumerate(DSA_TYPES):
        for name, a in random_weights(cfg, seed=40 + i).items():
            tensors["model.layers.%d.self_attn.%s.weight" % (i, name)] = a
        if kind == "full":
            D, rq = cfg["hidden_size"], cfg["q_lora_rank"]
            for name, shape in (("wq_b", (8 * 16, rq)), ("wk", (16, D)), ("weights_proj", (8, D))):
                tensors["model.layers.%d.self_attn.indexer.%s.weight" % (i, name)] = \
                    (rng.standard_normal(shape) / np.sqrt(shape[1])).astype(np.float32)
            tensors["model.layers.%d.self_attn.indexer.k_norm.weight" % i] = (1 + 0.2 * rng.standard_normal(16)).astype(np.float32)
            tensors["model.layers.%d.self_attn.indexer.k_norm.bias" % i] = (0.1 * rng.standard_normal(16)).astype(np.float32)
    write_safetensors(os.path.join(d, "model.safetensors"), tensors)
    return d


def test_model_kinds_and_steps(ctx, dsa_folder):
    """The attentions' kinds and sources; steps attention by attention (each on inputs of its own)
    equal each layer run alone where it stands alone, and the shared layers attend to the full
    layer's selection (not to every key) once the context passes index_topk."""
    T, D = 10, V3_SMALL["hidden_size"]
    model = clmla.Model.from_pretrained(dsa_folder, blocks=4, block_tokens=4, context=ctx)
    assert [(a.layer, a.kind, a.source) for a in model.attentions] == \
        [(0, "indexed", -1), (1, "shared", 0), (2, "shared", 0), (3, "indexed", -1)]
    assert model.cache.layers == 4
    xs = [random_x(T, D, seed=60 + i) for i in range(4)]
    seq = model.cache.add()
    got = [np.empty((T, D), np.float32) for _ in range(4)]
    for a, b in ((0, 6), (6, 8), (8, 9), (9, 10)):
        for i in range(4):
            got[i][a:b] = model.forward(i, xs[i][a:b], [(seq, b - a)])
    for i in (0, 3):  # a full layer stands alone
        alone = clmla.Layer.from_pretrained(dsa_folder, layer=i, context=ctx)
        cache = clmla.Cache(ctx, blocks=4, block_tokens=4, config=alone)
        s = cache.add()
        want = np.concatenate([alone(xs[i][a:b], [(s, b - a)], cache=cache) for a, b in ((0, 6), (6, 8), (8, 9), (9, 10))])
        np.testing.assert_array_equal(got[i], want)
    dense = clmla.Layer.from_pretrained(dsa_folder, layer=1, dense=True, context=ctx)
    cache = clmla.Cache(ctx, blocks=4, block_tokens=4, config=dense)
    y = dense(xs[1], [(cache.add(), T)], cache=cache)
    assert rel_err(got[1][:4], y[:4]) < 1e-5  # up to index_topk keys: every key
    assert rel_err(got[1][6:], y[6:]) > 1e-3  # past it: the selection
    # the whole step with a callback between the attentions, on a fresh sequence
    seq.free()
    s = model.cache.add()
    seen = []

    def between(i, attn):
        seen.append(i)
        return xs[i + 1]

    out = model.run(xs[0], [(s, T)], between)
    assert seen == [0, 1, 2]
    s.free()
    s = model.cache.add()
    want = None
    for i in range(4):
        want = model.forward(i, xs[i], [(s, T)])
    np.testing.assert_array_equal(out, want)
    model.close()


def test_model_refusals(ctx, dsa_folder):
    with pytest.raises(clmla.Error, match=r"layer 1 is a \"shared\".*start the range at layer 0"):
        clmla.Model.from_pretrained(dsa_folder, layers=range(1, 3), blocks=2, context=ctx)
    model = clmla.Model.from_pretrained(dsa_folder, layers=range(0, 2), blocks=2, context=ctx)
    s = model.cache.add()
    x = random_x(3, V3_SMALL["hidden_size"])
    with pytest.raises(clmla.Error, match=r"attention 1 \(decoder layer 1\) is a shared layer .* attention 0"):
        model.forward(1, x, [(s, 3)])
    assert s.length(1) == 0
    model.forward(0, x, [(s, 3)])
    with pytest.raises(clmla.Error, match="2 tokens"):
        model.forward(1, x[:2], [(s, 2)])
    with pytest.raises(clmla.Error, match="between must be callable"):
        model.run(x, [(s, 3)], None)
    model.close()
    with pytest.raises(clmla.Error, match="closed"):
        model.forward(0, x, [(s, 3)])


def test_cli_runs_shared_layer_after_its_full_layer(ctx, dsa_folder, tmp_path):
    """`clmla run --layer 2` on a shared layer runs layer 0 (its full layer) first on the same X: the
    output equals the model's layer 2 after layer 0 in every step."""
    cli = find_cli()
    if not cli:
        pytest.skip("the clmla command was not found: set CLMLA_CLI=/path/to/build/clmla")
    T, P = 9, 6
    x = random_x(T, V3_SMALL["hidden_size"], seed=77)
    np.save(tmp_path / "X.npy", x)
    cmd = [cli, "run", "--model", dsa_folder, "--layer", "2", "--input", str(tmp_path / "X.npy"),
           "--output", str(tmp_path / "Y.npy"), "--prefill", str(P), "--block-size", "4"]
    if os.environ.get("CLMLA_DEVICE"):
        cmd += ["--device", os.environ["CLMLA_DEVICE"]]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr + r.stdout
    model = clmla.Model.from_pretrained(dsa_folder, layers=range(0, 3), blocks=3, block_tokens=4, context=ctx)
    s = model.cache.add()
    y = np.empty_like(x)
    t = 0
    while t < T:
        n = P if t == 0 else 1
        model.forward(0, x[t:t + n], [(s, n)])
        y[t:t + n] = model.forward(2, x[t:t + n], [(s, n)])
        t += n
    np.testing.assert_array_equal(y, np.load(tmp_path / "Y.npy"))
    model.close()


def test_model_forward_cl(ctx, dsa_folder):
    """clmla_model_forward_cl on device buffers gives forward's output."""
    model = clmla.Model.from_pretrained(dsa_folder, layers=range(0, 2), blocks=4, block_tokens=4, context=ctx)
    x = random_x(6, V3_SMALL["hidden_size"], seed=5)
    s = model.cache.add()
    want = [model.forward(i, x, [(s, 6)]) for i in range(2)]
    s.free()
    s = model.cache.add()
    out = np.empty_like(x)
    with clmla._cl.Buffers(ctx.cl_context, ctx.queue, clmla._core._fail) as bufs:
        xm, om = bufs.upload(x), bufs.empty(out.nbytes)
        for i in range(2):
            model.forward_cl(i, xm, om, [(s, 6)])
            bufs.finish()
            bufs.download(om, out)
            np.testing.assert_array_equal(out, want[i])
    model.close()


def test_model_run_between_errors(ctx, dsa_folder):
    """An exception in between stops the step and is raised; a result of another shape is refused."""
    model = clmla.Model.from_pretrained(dsa_folder, layers=range(0, 2), blocks=4, block_tokens=4, context=ctx)
    x = random_x(5, V3_SMALL["hidden_size"], seed=6)

    def boom(i, attn):
        raise KeyError("engine")

    with pytest.raises(KeyError, match="engine"):
        model.run(x, [(model.cache.add(), 5)], boom)
    with pytest.raises(clmla.Error, match="between returned"):
        model.run(x, [(model.cache.add(), 5)], lambda i, attn: attn[:2])
    model.close()


def test_model_from_layers(ctx, dsa_folder):
    """A Model of the caller's Layers: kinds from their configurations, the same outputs as the
    folder's model; a shared layer with no indexer before it is refused."""
    layers = [clmla.Layer.from_pretrained(dsa_folder, layer=i, context=ctx) for i in range(3)]
    assert layers[1].config.index_shared == 1 and layers[1].config.index_n_heads == 0
    with pytest.raises(clmla.Error, match="layer 0 is a shared"):
        clmla.Model.from_layers(layers[1:], blocks=2)
    mine = clmla.Model.from_layers(layers, blocks=3, block_tokens=4)
    assert [(a.kind, a.source) for a in mine.attentions] == [("indexed", -1), ("shared", 0), ("shared", 0)]
    theirs = clmla.Model.from_pretrained(dsa_folder, layers=range(0, 3), blocks=3, block_tokens=4, context=ctx)
    x = random_x(9, V3_SMALL["hidden_size"], seed=8)
    a, b = mine.cache.add(), theirs.cache.add()
    for i in range(3):
        np.testing.assert_array_equal(mine.forward(i, x, [(a, 9)]), theirs.forward(i, x, [(b, 9)]))
    mine.close()
    theirs.close()
    assert not layers[0].closed  # the layers stay the caller's
