"""clmla.torch_ops: the torch custom operators give the plain clmla calls' results bit for bit,
pass torch.library.opcheck, and trace under torch.compile(fullgraph=True). Skipped without torch."""

import os
import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import clmla                      # noqa: E402
import clmla.torch_ops as ops     # noqa: E402

from conftest import V2_SMALL, random_weights  # noqa: E402

RKV, DR, H, BS = 128, 16, 4, 16
OPS = torch.ops.clmla


# ---- helpers -------------------------------------------------------------------------------------------------------

def kv_cache(num_blocks, dtype, seed=0):
    """An aligned engine cache [num_blocks, BS, 1, row] as a torch tensor (no copy), random rows."""
    a = clmla.empty_kv_cache(num_blocks, BS, RKV, DR, dtype)
    g = torch.Generator().manual_seed(seed)
    if dtype == "fp8":
        t = torch.from_numpy(a)
        rows = torch.randn(num_blocks * BS, RKV, generator=g)
        pe = torch.randn(num_blocks * BS, DR, generator=g)
        ops.concat_and_cache_impl(rows, pe, t, torch.arange(num_blocks * BS), "fp8_ds_mla")
        return t
    if dtype == "bf16":
        t = torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)
    else:
        t = torch.from_numpy(a)
    t.copy_(torch.randn(t.shape, generator=g))
    return t


def dense_tables():
    """Two sequences of 40 and 21 tokens over scattered blocks of an 8-block cache."""
    block_table = torch.tensor([[5, 0, 3], [6, 2, -1]], dtype=torch.int32)
    return block_table, torch.tensor([40, 21], dtype=torch.int32)


def query(S=2, dtype=torch.float32, seed=1):
    return torch.randn(2, S, H, RKV + DR, generator=torch.Generator().manual_seed(seed)).to(dtype)


def storages(*tensors):
    return {t.untyped_storage().data_ptr() for t in tensors if t is not None}


@pytest.fixture(scope="module")
def layer():
    return clmla.Layer(clmla.LayerConfig(**V2_SMALL), random_weights(V2_SMALL, seed=4))


def twin_caches(layer, n_seqs, blocks=16, layers=1):
    """Two empty caches of the same shape, each with n_seqs sequences (ids equal in both)."""
    out = []
    for _ in range(2):
        c = clmla.Cache(layer.context, blocks=blocks, block_tokens=BS, layers=layers, config=layer)
        out.append((c, [c.add() for _ in range(n_seqs)]))
    assert [s.id for s in out[0][1]] == [s.id for s in out[1][1]]
    return out


# ---- import and schemas --------------------------------------------------------------------------------------------

def test_import_clmla_leaves_torch_out():
    code = "import sys, clmla; print('torch' in sys.modules, 'clmla.torch_ops' in sys.modules)"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=dict(os.environ))
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["False", "False"]


def test_schemas():
    want = {
        "flash_mla_with_kvcache": "clmla::flash_mla_with_kvcache(Tensor q, Tensor k_cache, Tensor? block_table, "
                                  "Tensor? cache_seqlens, int head_dim_v, float? softmax_scale=None, "
                                  "bool causal=False, bool is_fp8_kvcache=False, Tensor? indices=None) "
                                  "-> (Tensor, Tensor)",
        "concat_and_cache_mla": "clmla::concat_and_cache_mla(Tensor kv_c, Tensor k_pe, Tensor(a!) kv_cache, "
                                "Tensor slot_mapping, str kv_cache_dtype) -> ()",
        "indexer_select": "clmla::indexer_select(Tensor q, Tensor weights, Tensor index_cache, Tensor block_table, "
                          "Tensor cache_seqlens, int top_k, bool causal=False, str index_dtype=\"f32\", "
                          "bool slots=False) -> Tensor",
        "layer_forward": "clmla::layer_forward(Tensor x, int layer_id, int cache_id, SymInt[] seq_ids, "
                         "SymInt[] num_tokens, int cache_layer=0) -> Tensor",
    }
    for name, schema in want.items():
        assert str(getattr(OPS, name).default._schema) == schema
    effects = torch._higher_order_ops.effects
    assert effects.has_effects(OPS.layer_forward.default)
    assert not effects.has_effects(OPS.flash_mla_with_kvcache.default)


# ---- the operators against the plain calls -------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", ["f32", "bf16", "fp8"])
@pytest.mark.parametrize("causal", [False, True])
def test_flash_mla_dense_matches_engine(dtype, causal):
    cache = kv_cache(8, dtype)
    bt, lens = dense_tables()
    fp8 = dtype == "fp8"
    for q in (query(), query(dtype=torch.bfloat16)):
        out, lse = OPS.flash_mla_with_kvcache(q, cache, bt, lens, RKV, causal=causal, is_fp8_kvcache=fp8)
        ref_out, ref_lse = clmla.flash_mla_with_kvcache(q, cache, bt, lens, RKV, None, causal=causal,
                                                        is_fp8_kvcache=fp8)
        assert out.dtype == q.dtype and out.shape == (2, 2, H, RKV)
        assert lse.dtype == torch.float32 and lse.shape == (2, H, 2)
        assert torch.equal(out, ref_out) and torch.equal(lse, ref_lse)
        assert not storages(out, lse) & storages(q, cache, bt, lens)


def test_flash_mla_sparse_and_scale_match_engine():
    cache = kv_cache(8, "f32")
    q = query(S=3)
    idx = torch.randint(-1, 8 * BS, (2, 3, 8), generator=torch.Generator().manual_seed(2), dtype=torch.int32)
    out, lse = OPS.flash_mla_with_kvcache(q, cache, None, None, RKV, softmax_scale=0.07, indices=idx)
    ref = clmla.flash_mla_with_kvcache(q, cache, None, None, RKV, None, softmax_scale=0.07, indices=idx)
    assert torch.equal(out, ref[0]) and torch.equal(lse, ref[1])


@pytest.mark.parametrize("dtype,kv_dtype", [("f32", "auto"), ("bf16", "auto"), ("fp8", "fp8_ds_mla")])
def test_concat_and_cache_matches_engine(dtype, kv_dtype):
    a, b = kv_cache(4, dtype), kv_cache(4, dtype)
    g = torch.Generator().manual_seed(3)
    kv_c, k_pe = torch.randn(5, RKV, generator=g), torch.randn(5, 1, DR, generator=g)
    slots = torch.tensor([7, 0, -1, 63, 20])
    assert OPS.concat_and_cache_mla(kv_c, k_pe, a, slots, kv_dtype) is None
    clmla.concat_and_cache_mla(kv_c, k_pe, b, slots, kv_dtype)
    assert torch.equal(a.view(torch.uint8), b.view(torch.uint8))
    assert not torch.equal(a.view(torch.uint8), kv_cache(4, dtype).view(torch.uint8))


def index_inputs(seed=5):
    g = torch.Generator().manual_seed(seed)
    keys = torch.randn(8, BS, 32, generator=g)
    q = torch.randn(2, 2, 4, 32, generator=g)
    w = torch.rand(2, 2, 4, generator=g) + 0.1
    bt, lens = dense_tables()
    return q, w, keys, bt, lens


@pytest.mark.parametrize("slots", [False, True])
def test_indexer_select_matches_engine(slots):
    q, w, keys, bt, lens = index_inputs()
    got = OPS.indexer_select(q, w, keys, bt, lens, 6, causal=True, slots=slots)
    ref = clmla.indexer_select(q, w, keys, bt, lens, 6, causal=True, slots=slots)
    assert got.dtype == torch.int32 and got.shape == (2, 2, 6)
    assert np.array_equal(got.numpy(), ref)


def test_layer_forward_matches_layer(layer):
    (ca, sa), (cb, sb) = twin_caches(layer, 2)
    lid, cid = ops.register_layer(layer), ops.register_cache(cb)
    try:
        D = layer.config.hidden_size
        g = torch.Generator().manual_seed(6)
        for n0, n1 in [(5, 3), (1, 1), (1, 0), (2, 1)]:     # a prefill, then decode steps (one entry skips)
            entries = [(i, n) for i, n in enumerate((n0, n1)) if n]
            x = torch.randn(n0 + n1, D, generator=g)
            ref = layer(x, batch=[(sa[i], n) for i, n in entries], cache=ca)
            y = OPS.layer_forward(x, lid, cid, [sb[i].id for i, _ in entries], [n for _, n in entries])
            assert y.dtype == torch.float32 and torch.equal(y, torch.from_numpy(ref))
        for s, t in zip(sa, sb):
            assert len(s) == len(t) and all(np.array_equal(u, v) for u, v in zip(s.read(), t.read()))
        xb = torch.randn(2, D, generator=g).to(torch.bfloat16)
        yb = OPS.layer_forward(xb, lid, cid, [sb[0].id], [2])
        ref = layer(xb, batch=[(sa[0], 2)], cache=ca)
        assert yb.dtype == torch.bfloat16 and torch.equal(yb, torch.from_numpy(ref).to(torch.bfloat16))
    finally:
        ops.unregister(lid)
        ops.unregister(cid)


def test_registry(layer):
    cache = clmla.Cache(layer.context, blocks=4, block_tokens=BS, config=layer)
    seq = cache.add()
    lid, cid = ops.register_layer(layer), ops.register_cache(cache)
    try:
        assert ops.register_layer(layer) == lid and lid != cid
        assert ops.registered(lid) is layer and ops.registered(cid) is cache
        x = torch.zeros(1, layer.config.hidden_size)
        with pytest.raises(clmla.Error, match="not a clmla.Layer"):
            OPS.layer_forward(x, cid, cid, [seq.id], [1])
        with pytest.raises(clmla.Error, match="no live sequence"):
            OPS.layer_forward(x, lid, cid, [seq.id + 1], [1])
        with pytest.raises(clmla.Error, match="one entry per batch entry"):
            OPS.layer_forward(x, lid, cid, [seq.id], [1, 1])
        seq.free()
        with pytest.raises(clmla.Error, match="no live sequence"):
            OPS.layer_forward(x, lid, cid, [0], [1])
        with pytest.raises(clmla.Error):
            ops.register_cache(layer)
    finally:
        ops.unregister(lid)
        ops.unregister(cid)
    with pytest.raises(clmla.Error, match="no clmla layer or cache"):
        ops.unregister(lid)
    with pytest.raises(clmla.Error, match="no clmla layer or cache"):
        OPS.layer_forward(torch.zeros(1, 48), lid, cid, [0], [1])


# ---- opcheck -------------------------------------------------------------------------------------------------------

def test_opcheck_flash_mla():
    cache = kv_cache(8, "f32")
    bt, lens = dense_tables()
    torch.library.opcheck(OPS.flash_mla_with_kvcache.default, (query(), cache, bt, lens, RKV), {"causal": True})
    idx = torch.randint(-1, 8 * BS, (2, 2, 8), generator=torch.Generator().manual_seed(2), dtype=torch.int32)
    torch.library.opcheck(OPS.flash_mla_with_kvcache.default, (query(), cache, None, None, RKV),
                          {"indices": idx, "softmax_scale": 0.1})


def test_opcheck_concat_and_cache():
    # every run writes the same rows to the same slots, so the runs agree
    g = torch.Generator().manual_seed(3)
    args = (torch.randn(5, RKV, generator=g), torch.randn(5, DR, generator=g), kv_cache(4, "f32"),
            torch.tensor([7, 0, -1, 63, 20]), "auto")
    torch.library.opcheck(OPS.concat_and_cache_mla.default, args)


def test_opcheck_indexer_select():
    q, w, keys, bt, lens = index_inputs()
    torch.library.opcheck(OPS.indexer_select.default, (q, w, keys, bt, lens, 6), {"slots": True})


def test_opcheck_layer_forward(layer):
    # opcheck runs the op several times, each appending the step's tokens again. Every token of a
    # sequence has the same hidden state, so every value the sequence attends to is the same and
    # its output is that value whatever the cache holds: the runs agree to rounding.
    cache = clmla.Cache(layer.context, blocks=16, block_tokens=BS, config=layer)
    s0, s1 = cache.add(), cache.add()
    lid, cid = ops.register_layer(layer), ops.register_cache(cache)
    try:
        rows = torch.randn(2, layer.config.hidden_size, generator=torch.Generator().manual_seed(7))
        x = rows[[0, 0, 0, 1]]
        torch.library.opcheck(OPS.layer_forward.default, (x, lid, cid, [s0.id, s1.id], [3, 1]))
        assert len(s0) >= 6 and len(s0) == 3 * len(s1)
    finally:
        ops.unregister(lid)
        ops.unregister(cid)


# ---- torch.compile -------------------------------------------------------------------------------------------------

def write_then_attend(q, cache, bt, lens, kv_c, k_pe, slots):
    OPS.concat_and_cache_mla(kv_c, k_pe, cache, slots, "auto")
    out, lse = OPS.flash_mla_with_kvcache(q, cache, bt, lens, RKV, causal=True)
    return out * 2.0, lse


def test_compile_fullgraph_engine_ops():
    """The default backend (inductor; a C++ compiler builds its kernel for out * 2)."""
    torch._dynamo.reset()
    bt, lens = dense_tables()
    g = torch.Generator().manual_seed(8)
    kv_c, k_pe = torch.randn(2, RKV, generator=g), torch.randn(2, DR, generator=g)
    slots = torch.tensor([3 * BS + 7, 2 * BS + 4])          # the last token of each sequence
    q = query()
    a, b = kv_cache(8, "f32"), kv_cache(8, "f32")
    ref = write_then_attend(q, a, bt, lens, kv_c, k_pe, slots)
    got = torch.compile(write_then_attend, fullgraph=True)(q, b, bt, lens, kv_c, k_pe, slots)
    assert torch.equal(got[0], ref[0]) and torch.equal(got[1], ref[1])
    assert torch.equal(a, b)                                  # the write reached the caller's cache


def two_layer_steps(x, lid, cid, seq_ids, num_tokens):
    h = OPS.layer_forward(x, lid, cid, seq_ids, num_tokens, cache_layer=0)
    return OPS.layer_forward(x + h, lid, cid, seq_ids, num_tokens, cache_layer=1) * 0.5


def test_compile_fullgraph_layer_forward(layer):
    """aot_eager: the traced graph as inductor receives it, without building C++ kernels."""
    torch._dynamo.reset()
    (ca, sa), (cb, sb) = twin_caches(layer, 2, layers=2)
    ia, ib = [(ops.register_layer(layer), ops.register_cache(c)) for c in (ca, cb)]
    try:
        step = torch.compile(two_layer_steps, fullgraph=True, backend="aot_eager")
        g = torch.Generator().manual_seed(9)
        for ns in ([4, 2], [1, 1], [1, 1], [2, 3]):
            x = torch.randn(sum(ns), layer.config.hidden_size, generator=g)
            ref = two_layer_steps(x, *ia, [s.id for s in sa], ns)
            got = step(x, *ib, [s.id for s in sb], ns)
            assert torch.equal(got, ref)
        assert [len(s) for s in sb] == [8, 7] and [s.length(1) for s in sb] == [8, 7]
    finally:
        for i in set(ia + ib):
            ops.unregister(i)


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_compile_keeps_layer_forward_with_unused_output(layer, backend):
    """The ordered effect keeps a call whose output is unused (it still appends its tokens)."""
    torch._dynamo.reset()
    cache = clmla.Cache(layer.context, blocks=4, block_tokens=BS, config=layer)
    seq = cache.add()
    lid, cid = ops.register_layer(layer), ops.register_cache(cache)
    try:
        def append_only(x):
            OPS.layer_forward(x, lid, cid, [seq.id], [x.shape[0]])
            return x

        torch.compile(append_only, fullgraph=True, backend=backend)(torch.randn(3, layer.config.hidden_size))
        assert len(seq) == 3
    finally:
        ops.unregister(lid)
        ops.unregister(cid)
