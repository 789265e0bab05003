"""clmla.engine (FlashMLA's flash_mla_with_kvcache / get_mla_metadata, vLLM's concat_and_cache_mla)
against a float64 numpy reference over the cache rows as stored, decoded here by hand: float16
through numpy, bfloat16 by bit shift, FlashMLA's fp8 rows (e4m3 codes, float32 scales per 128,
bfloat16 rope) bit by bit."""

import numpy as np
import pytest

import clmla

RKV, DR, H = 128, 16, 4     # small layout; the 576 convention (512 + 64) in a few cases
TOL_OUT, TOL_LSE = 1e-5, 1e-5


# ---- decoding the cache rows (independent of the library) -----------------------------------------------------------

def bf16_value(bits):
    return (np.asarray(bits, np.uint16).astype(np.uint32) << 16).view(np.float32).astype(np.float64)


def e4m3_value(codes):
    c = np.asarray(codes, np.uint8).astype(np.int64)
    sign = np.where(c & 0x80, -1.0, 1.0)
    exp, man = (c >> 3) & 0xF, c & 0x7
    mag = np.where(exp == 0, man / 8.0 * 2.0 ** -6, (1.0 + man / 8.0) * 2.0 ** (exp - 7))
    mag = np.where((c & 0x7F) == 0x7F, np.nan, mag)
    return sign * mag


def row_size(dtype, rkv, dr):
    return rkv + rkv // 32 + 2 * dr if dtype == "fp8" else rkv + dr


def decode(cache, dtype, rkv, dr):
    """Every slot's row as float64 [num_blocks * block_size, rkv + dr]."""
    rows = np.asarray(cache).reshape(-1, row_size(dtype, rkv, dr))
    if dtype == "f32":
        return rows.astype(np.float64)
    if dtype == "f16":
        return rows.view(np.float16).astype(np.float64)
    if dtype == "bf16":
        return bf16_value(rows.view(np.uint16))
    codes = rows[:, :rkv]
    scales = np.ascontiguousarray(rows[:, rkv: rkv + rkv // 32]).view(np.float32).astype(np.float64)
    rope = np.ascontiguousarray(rows[:, rkv + rkv // 32:]).view(np.uint16)
    latent = e4m3_value(codes) * np.repeat(scales, 128, axis=1)
    return np.concatenate([latent, bf16_value(rope)], axis=1)


def random_cache(rng, num_blocks, bs, dtype, rkv=RKV, dr=DR, heads_axis=True):
    """A cache of random rows in an aligned array from clmla.empty_kv_cache."""
    cache = clmla.empty_kv_cache(num_blocks, bs, rkv, dr, dtype, heads_axis=heads_axis)
    n = num_blocks * bs
    if dtype == "fp8":
        codes = rng.integers(0, 256, (n, rkv), dtype=np.uint8)
        codes[(codes & 0x7F) == 0x7F] = 0x7E                       # no NaN codes
        scales = (2.0 ** rng.integers(-9, -5, (n, rkv // 128))).astype(np.float32)
        rope = (rng.standard_normal((n, dr)).astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
        rows = np.concatenate([codes, scales.view(np.uint8), rope.view(np.uint8)], axis=1)
    else:
        x = rng.standard_normal((n, rkv + dr)).astype(np.float32)
        rows = {"f32": x, "f16": x.astype(np.float16),
                "bf16": (x.view(np.uint32) >> 16).astype(np.uint16)}[dtype]
    cache.view(rows.dtype).reshape(rows.shape)[...] = rows
    return cache


def scattered_tables(rng, lens, bs, num_blocks, pad=2):
    """Block tables giving each sequence distinct, shuffled blocks; unused entries -1."""
    need = [-(-n // bs) for n in lens]
    ids = rng.permutation(num_blocks)
    table = np.full((len(lens), max(need) + pad), -1, np.int32)
    k = 0
    for b, nb in enumerate(need):
        table[b, :nb] = ids[k: k + nb]
        k += nb
    return table


# ---- the reference -------------------------------------------------------------------------------------------------

def attend(q, keys, rkv, scale):
    """Softmax attention of q [H, D] over keys [n, D] (float64): out [H, rkv], lse [H]."""
    if len(keys) == 0:
        return np.zeros((q.shape[0], rkv)), np.full(q.shape[0], -np.inf)
    s = (q @ keys.T) * scale
    m = s.max(axis=1, keepdims=True)
    p = np.exp(s - m)
    l_ = p.sum(axis=1, keepdims=True)
    return (p @ keys[:, :rkv]) / l_, (m + np.log(l_))[:, 0]


def ref_dense(q, rows, table, lens, bs, rkv, scale, causal):
    q = q.astype(np.float64)
    B, S, Hq, _ = q.shape
    out, lse = np.zeros((B, S, Hq, rkv)), np.zeros((B, Hq, S))
    for b in range(B):
        slots = [table[b, j // bs] * bs + j % bs for j in range(lens[b])]
        keys = rows[slots]
        for i in range(S):
            n = min(max(lens[b] - S + i + 1, 0), lens[b]) if causal else lens[b]
            out[b, i], lse[b, :, i] = attend(q[b, i], keys[:n], rkv, scale)
    return out, lse


def ref_sparse(q, rows, idx, rkv, scale):
    q = q.astype(np.float64)
    B, S, Hq, _ = q.shape
    out, lse = np.zeros((B, S, Hq, rkv)), np.zeros((B, Hq, S))
    for b in range(B):
        for i in range(S):
            sel = [s for s in idx[b, i] if 0 <= s < len(rows)]
            out[b, i], lse[b, :, i] = attend(q[b, i], rows[sel], rkv, scale)
    return out, lse


def check(out, lse, ref_out, ref_lse):
    out, lse = np.asarray(out, np.float64), np.asarray(lse)
    assert out.shape == ref_out.shape and lse.shape == ref_lse.shape
    assert lse.dtype == np.float32
    err = np.max(np.abs(out - ref_out)) / max(np.max(np.abs(ref_out)), 1e-30)
    assert err <= TOL_OUT, err
    fin = np.isfinite(ref_lse)
    assert np.array_equal(np.isfinite(lse), fin)
    assert np.all(lse[~fin] == -np.inf)
    assert np.max(np.abs(lse[fin] - ref_lse[fin]), initial=0) <= TOL_LSE


def queries(rng, B, S, Hq=H, D=RKV + DR):
    return rng.standard_normal((B, S, Hq, D)).astype(np.float32)


# ---- dense attention -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype,bs", [("f32", 16), ("f32", 1), ("f16", 5), ("bf16", 64), ("fp8", 5), ("fp8", 16)])
def test_dense(ctx, dtype, bs):
    rng = np.random.default_rng(bs * 7 + len(dtype))
    lens = [1, 37, 20, 4]
    num_blocks = sum(-(-n // bs) for n in lens) + 3
    cache = random_cache(rng, num_blocks, bs, dtype)
    rows = decode(cache, dtype, RKV, DR)
    table = scattered_tables(rng, lens, bs, num_blocks)
    meta, splits = clmla.get_mla_metadata(np.array(lens, np.int32), 1, 1)
    assert splits is None
    for S in (1, 2, 3, 4):
        q = queries(rng, len(lens), S)
        for causal in (False, True):
            out, lse = clmla.flash_mla_with_kvcache(q, cache, table, np.array(lens, np.int32), RKV, meta, None,
                                                    causal=causal, is_fp8_kvcache=dtype == "fp8", context=ctx)
            assert out.dtype == np.float32
            check(out, lse, *ref_dense(q, rows, table, lens, bs, RKV, (RKV + DR) ** -0.5, causal))


def test_dense_576(ctx):
    """DeepSeek's shape: rkv 512, dr 64, 16 heads, a bfloat16 cache of 64-token blocks."""
    rng = np.random.default_rng(576)
    lens, bs = [70, 3], 64
    cache = random_cache(rng, 4, bs, "bf16", 512, 64)
    table = np.array([[2, 0], [3, -1]], np.int32)
    q = queries(rng, 2, 2, 16, 576)
    scale = 0.1
    out, lse = clmla.flash_mla_with_kvcache(q, cache, table, np.array(lens), 512, None, softmax_scale=scale,
                                            causal=True, context=ctx)
    assert out.shape == (2, 2, 16, 512) and lse.shape == (2, 16, 2)
    check(out, lse, *ref_dense(q, decode(cache, "bf16", 512, 64), table, lens, bs, 512, scale, True))


def test_default_scale_and_layouts(ctx):
    """softmax_scale None is q.shape[-1] ** -0.5; a cache without the heads axis (vLLM's layout)
    gives the same; other integer table dtypes are taken."""
    rng = np.random.default_rng(3)
    cache = random_cache(rng, 6, 16, "f32")
    table, lens = np.array([[4, 1, 0]], np.int64), np.array([40], np.int64)
    q = queries(rng, 1, 3)
    meta, splits = clmla.get_mla_metadata()
    assert isinstance(meta, clmla.engine.FlashMLASchedMeta) and splits is None
    out, lse = clmla.flash_mla_with_kvcache(q, cache, table, lens, RKV, meta, context=ctx)
    out2, lse2 = clmla.flash_mla_with_kvcache(q, cache, table, lens, RKV, None, softmax_scale=(RKV + DR) ** -0.5,
                                              context=ctx)
    out3, lse3 = clmla.flash_mla_with_kvcache(q, cache.reshape(6, 16, RKV + DR), table, lens, RKV, None, context=ctx)
    assert np.array_equal(out, out2) and np.array_equal(lse, lse2)
    assert np.array_equal(out, out3) and np.array_equal(lse, lse3)
    ref = ref_dense(q, decode(cache, "f32", RKV, DR), table, lens, 16, RKV, (RKV + DR) ** -0.5, False)
    check(out, lse, *ref)
    # q in float16: computed in float32, out in float16
    q16 = q.astype(np.float16)
    o16, l16 = clmla.flash_mla_with_kvcache(q16, cache, table, lens, RKV, None, context=ctx)
    assert o16.dtype == np.float16 and l16.dtype == np.float32
    o32, _ = clmla.flash_mla_with_kvcache(q16.astype(np.float32), cache, table, lens, RKV, None, context=ctx)
    assert np.array_equal(o16, o32.astype(np.float16))


def test_empty_sequence_and_causal_overhang(ctx):
    """A sequence of no keys, and causal queries before the first key, get out 0 and lse -inf."""
    rng = np.random.default_rng(4)
    cache = random_cache(rng, 3, 16, "f32")
    table, lens = np.array([[0], [2]], np.int32), np.array([0, 2], np.int32)
    q = queries(rng, 2, 4)
    out, lse = clmla.flash_mla_with_kvcache(q, cache, table, lens, RKV, None, causal=True, context=ctx)
    assert np.all(out[0] == 0) and np.all(lse[0] == -np.inf)
    assert np.all(lse[1, :, :2] == -np.inf) and np.all(np.isfinite(lse[1, :, 2:]))
    check(out, lse, *ref_dense(q, decode(cache, "f32", RKV, DR), table, lens, 16, RKV, (RKV + DR) ** -0.5, True))


# ---- sparse attention --------------------------------------------------------------------------------------------

def random_indices(rng, B, S, topk, num_slots):
    idx = rng.integers(0, num_slots, (B, S, topk)).astype(np.int32)
    idx[rng.random(idx.shape) < 0.2] = -1
    idx[rng.random(idx.shape) < 0.05] = num_slots + 3       # outside the cache: no key
    return idx


@pytest.mark.parametrize("dtype,bs", [("f32", 16), ("fp8", 64)])
def test_sparse(ctx, dtype, bs):
    rng = np.random.default_rng(11)
    num_blocks, B, S, topk = 5, 3, 2, 24
    cache = random_cache(rng, num_blocks, bs, dtype)
    rows = decode(cache, dtype, RKV, DR)
    idx = random_indices(rng, B, S, topk, num_blocks * bs)
    idx[2, 1] = -1                                          # a query with no key
    q = queries(rng, B, S)
    out, lse = clmla.flash_mla_with_kvcache(q, cache, None, None, RKV, None, is_fp8_kvcache=dtype == "fp8",
                                            indices=idx, context=ctx)
    assert np.all(out[2, 1] == 0) and np.all(lse[2, :, 1] == -np.inf)
    check(out, lse, *ref_sparse(q, rows, idx, RKV, (RKV + DR) ** -0.5))
    # topk_length: only the leftmost entries count
    tl = np.array([5, 0, 30], np.int32)
    out, lse = clmla.flash_mla_with_kvcache(q, cache, None, None, RKV, None, is_fp8_kvcache=dtype == "fp8",
                                            indices=idx, topk_length=tl, context=ctx)
    cut = idx.copy()
    cut[np.broadcast_to(np.arange(topk)[None, None, :] >= tl[:, None, None], cut.shape)] = -1
    check(out, lse, *ref_sparse(q, rows, cut, RKV, (RKV + DR) ** -0.5))


def test_sparse_sink_and_extra_576(ctx):
    """DeepSeek-V3.2's call: fp8 rows of 656 bytes, slot indices, an attention sink and an extra
    cache (another block size), combined by their log-sum-exps."""
    rng = np.random.default_rng(12)
    B, S, Hq, topk = 2, 1, 16, 40
    cache = random_cache(rng, 3, 64, "fp8", 512, 64)
    extra = random_cache(rng, 4, 5, "fp8", 512, 64)
    assert cache.shape == (3, 64, 1, 656)
    rows, erows = decode(cache, "fp8", 512, 64), decode(extra, "fp8", 512, 64)
    idx, eidx = random_indices(rng, B, S, topk, 3 * 64), random_indices(rng, B, S, 8, 4 * 5)
    eidx[1] = -1                                           # sequence 1: no extra key
    etl = np.array([6, 8], np.int32)
    sink = rng.standard_normal(Hq).astype(np.float32)
    sink[0], sink[1] = np.inf, -np.inf
    q = queries(rng, B, S, Hq, 576)
    scale = 576 ** -0.5
    out, lse = clmla.flash_mla_with_kvcache(q, cache, None, None, 512, None, is_fp8_kvcache=True, indices=idx,
                                            attn_sink=sink, extra_k_cache=extra, extra_indices_in_kvcache=eidx,
                                            extra_topk_length=etl, context=ctx)
    ecut = eidx.copy()
    ecut[np.broadcast_to(np.arange(8)[None, None, :] >= etl[:, None, None], ecut.shape)] = -1
    o1, l1 = ref_sparse(q, rows, idx, 512, scale)
    o2, l2 = ref_sparse(q, erows, ecut, 512, scale)
    ref_lse = np.logaddexp(l1, l2)
    w1, w2 = np.exp(l1 - ref_lse), np.exp(l2 - ref_lse)     # [B, H, S]
    ref_out = o1 * w1.transpose(0, 2, 1)[..., None] + o2 * w2.transpose(0, 2, 1)[..., None]
    gate = np.exp(ref_lse) / (np.exp(ref_lse) + np.exp(sink.astype(np.float64))[None, :, None])
    ref_out = ref_out * gate.transpose(0, 2, 1)[..., None]
    assert np.all(out[:, :, 0] == 0)                        # +inf sink
    check(out, lse, ref_out, ref_lse)


# ---- concat_and_cache_mla ------------------------------------------------------------------------------------------

def within_rounding(dtype, got, x):
    """|got - x| within the rounding of the cache's dtype (fp8: the tile's scale's e4m3 step)."""
    err = np.abs(got - x)
    if dtype == "f32":
        return np.array_equal(got, x)
    if dtype == "f16":
        return np.all(err <= np.abs(x) * 2.0 ** -11 + 2.0 ** -25)
    if dtype == "bf16":
        return np.all(err <= np.abs(x) * 2.0 ** -8)
    latent, rope = got[:, :RKV], got[:, RKV:]
    xl, xr = x[:, :RKV], x[:, RKV:]
    amax = np.abs(xl).reshape(len(x), -1, 128).max(axis=2)
    scale = 2.0 ** np.ceil(np.log2(np.maximum(amax / 448, 1e-4)))
    step = np.repeat(scale, 128, axis=1) * 2.0 ** -10
    return (np.all(np.abs(latent - xl) <= np.maximum(np.abs(xl) * 2.0 ** -4, step))
            and np.all(np.abs(rope - xr) <= np.abs(xr) * 2.0 ** -8))


@pytest.mark.parametrize("dtype,bs", [("f32", 16), ("f16", 5), ("bf16", 16), ("fp8", 16), ("fp8", 1)])
def test_concat_and_cache_round_trip(ctx, dtype, bs):
    rng = np.random.default_rng(21)
    T = 20
    num_blocks = -(-T // bs) + 2
    cache = random_cache(rng, num_blocks, bs, dtype)
    before = cache.copy()
    x = rng.standard_normal((T, RKV + DR)).astype(np.float32) * 3
    kv_c, k_pe = x[:, :RKV], x[:, RKV:]                     # strided row views of one array
    slots = rng.permutation(num_blocks * bs)[:T].astype(np.int64)
    slots[[3, 11]] = -1
    ret = clmla.concat_and_cache_mla(kv_c, k_pe[:, None, :], cache, slots, "fp8_ds_mla" if dtype == "fp8" else "auto",
                                     np.ones(1, np.float32), context=ctx)
    assert ret is None
    written = slots[slots >= 0]
    got = decode(cache, dtype, RKV, DR)[written]
    assert within_rounding(dtype, got, x[slots >= 0].astype(np.float64))
    rows_now = cache.reshape(num_blocks * bs, -1)
    rows_before = before.reshape(num_blocks * bs, -1)
    untouched = np.setdiff1d(np.arange(num_blocks * bs), written)
    assert np.array_equal(rows_now[untouched].view(np.uint8), rows_before[untouched].view(np.uint8))


def test_concat_then_attend_in_place(ctx):
    """Rows written by concat_and_cache_mla are read by flash_mla_with_kvcache from the same
    aligned array; on a device sharing host memory neither call copies the cache."""
    rng = np.random.default_rng(22)
    bs, num_blocks = 16, 4
    cache = clmla.empty_kv_cache(num_blocks, bs, RKV, DR, "bf16", heads_axis=False, context=ctx)
    assert cache.shape == (num_blocks, bs, RKV + DR)
    info0 = clmla.paged_info(RKV, DR, bs, "bf16", context=ctx)
    assert cache.ctypes.data % info0["host_alignment"] == 0
    table = np.array([[3, 1, 2]], np.int32)
    n = 40
    slots = np.array([table[0, j // bs] * bs + j % bs for j in range(n)], np.int32)
    ident = id(cache)
    kv_c, k_pe = rng.standard_normal((n, RKV)).astype(np.float32), rng.standard_normal((n, DR)).astype(np.float32)
    clmla.concat_and_cache_mla(kv_c, k_pe, cache, slots, "auto", context=ctx)
    info1 = clmla.paged_info(RKV, DR, bs, "bf16", context=ctx)
    q = queries(rng, 1, 2)
    out, lse = clmla.flash_mla_with_kvcache(q, cache, table, np.array([n], np.int32), RKV, None, causal=True,
                                            context=ctx)
    assert id(cache) == ident
    check(out, lse, *ref_dense(q, decode(cache, "bf16", RKV, DR), table, [n], bs, RKV, (RKV + DR) ** -0.5, True))
    info2 = clmla.paged_info(RKV, DR, bs, "bf16", context=ctx)
    if info0["host_unified"]:
        # the write copies at most its inputs, the attention nothing (its own arrays are aligned too)
        assert info1["host_copied_bytes"] - info0["host_copied_bytes"] <= kv_c.nbytes + k_pe.nbytes + slots.nbytes
        assert info2["host_copied_bytes"] == info1["host_copied_bytes"]
        assert info2["host_wrapped"] > info1["host_wrapped"] > info0["host_wrapped"]
    # a cache that is not aligned is copied, with the same results
    raw = np.zeros(cache.nbytes + 2, np.uint8)
    moved = raw[2: 2 + cache.nbytes].view(np.uint16).reshape(cache.shape)
    moved[...] = cache.view(np.uint16)
    out2, lse2 = clmla.flash_mla_with_kvcache(q, moved, table, np.array([n], np.int32), RKV, None, causal=True,
                                              context=ctx)
    assert np.array_equal(out, out2) and np.array_equal(lse, lse2)
    info3 = clmla.paged_info(RKV, DR, bs, "bf16", context=ctx)
    if moved.ctypes.data % info0["host_alignment"] or not info0["host_unified"]:
        assert info3["host_copied_bytes"] - info2["host_copied_bytes"] >= cache.nbytes
    # a cache 48 bytes into an aligned array (a layer's part of a larger tensor) is used in place
    big = clmla.empty_kv_cache(num_blocks + 1, bs, RKV, DR, "bf16", heads_axis=False, context=ctx)
    inner = big.reshape(-1).view(np.uint8)[48: 48 + cache.nbytes].view(np.uint16).reshape(cache.shape)
    inner[...] = cache.view(np.uint16)
    out3, lse3 = clmla.flash_mla_with_kvcache(q, inner, table, np.array([n], np.int32), RKV, None, causal=True,
                                              context=ctx)
    assert np.array_equal(out, out3) and np.array_equal(lse, lse3)
    info4 = clmla.paged_info(RKV, DR, bs, "bf16", context=ctx)
    if info0["host_unified"]:
        assert info4["host_copied_bytes"] == info3["host_copied_bytes"]
    assert clmla.paged_status(ctx) == set()


def test_empty_kv_cache_dtypes(ctx):
    for dtype, np_names, row in (("f32", ("float32",), 144), ("f16", ("float16",), 144),
                                 ("bf16", ("bfloat16", "uint16"), 144), ("fp8", ("uint8",), 164)):
        c = clmla.empty_kv_cache(2, 3, RKV, DR, dtype, context=ctx)
        assert c.shape == (2, 3, 1, row) and c.dtype.name in np_names and not c.any()
        assert c.ctypes.data % clmla.paged_info(RKV, DR, 3, dtype, context=ctx)["host_alignment"] == 0


# ---- refusals ---------------------------------------------------------------------------------------------------

def refused(fn, *args, names=(), status=None, **kw):
    with pytest.raises(clmla.Error) as e:
        fn(*args, **kw)
    for n in names:
        assert n in str(e.value), (n, str(e.value))
    if status:
        assert e.value.status == status
    return str(e.value)


def test_refusals(ctx):
    rng = np.random.default_rng(31)
    cache = random_cache(rng, 4, 16, "f32")
    table, lens = np.array([[0, 1]], np.int32), np.array([20], np.int32)
    q = queries(rng, 1, 1)
    f = clmla.flash_mla_with_kvcache
    kw = dict(context=ctx)
    # q's last dim against the cache's rows
    m = refused(f, queries(rng, 1, 1, H, RKV + DR + 2), cache, table, lens, RKV, None, names=("k_cache", "q"),
                status="CLMLA_ERROR_SHAPE_MISMATCH", **kw)
    assert "144" in m and "146" in m
    refused(f, q, cache, table, lens, RKV + 1, None, names=("head_dim_v",), **kw)          # odd rope dim
    refused(f, q, cache, table, lens, RKV + DR + 1, None, names=("head_dim_v",), **kw)     # past q's last dim
    refused(f, q, cache, table, lens, 64, None, names=("head_dim_v", "128"), is_fp8_kvcache=True,
            **kw)
    refused(f, q, cache[:, ::2], table, lens, RKV, None, names=("k_cache", "contiguous"), **kw)
    refused(f, q, np.concatenate([cache, cache], axis=2), table, lens, RKV, None, names=("k_cache", "heads_k"), **kw)
    refused(f, q, cache.astype(np.float64), table, lens, RKV, None, names=("k_cache", "float64"), **kw)
    refused(f, q, cache.view(np.uint8), table, lens, RKV, None, names=("k_cache", "is_fp8_kvcache"), **kw)
    refused(f, q.astype(np.int32), cache, table, lens, RKV, None, names=("q", "int32"), **kw)
    refused(f, q, cache, table.astype(np.float32), lens, RKV, None, names=("block_table",), **kw)
    m = refused(f, q, cache, np.array([[0, 9]], np.int32), lens, RKV, None, names=("block_table", "num_blocks"), **kw)
    assert "9" in m and "4" in m
    m = refused(f, q, cache, table, np.array([33], np.int32), RKV, None, names=("cache_seqlens", "block_table"), **kw)
    assert "33" in m and "32" in m
    refused(f, q, cache, table, np.array([1, 2], np.int32), RKV, None, names=("cache_seqlens",),
            status="CLMLA_ERROR_SHAPE_MISMATCH", **kw)
    refused(f, q, cache, None, None, RKV, None, names=("block_table",), **kw)
    idx = np.zeros((1, 1, 4), np.int32)
    refused(f, q, cache, table, lens, RKV, None, causal=True, indices=idx, names=("causal", "indices"), **kw)
    refused(f, q, cache, table, lens, RKV, None, indices=np.zeros((1, 2, 4), np.int32), names=("indices",), **kw)
    refused(f, q, cache, table, lens, RKV, None, topk_length=np.ones(1, np.int32), names=("topk_length",), **kw)
    refused(f, q, cache, None, None, RKV, None, indices=idx, extra_k_cache=cache, names=("extra_indices_in_kvcache",),
            **kw)
    refused(f, q, cache, None, None, RKV, None, indices=idx, attn_sink=np.zeros(H + 1, np.float32),
            names=("attn_sink",), **kw)
    refused(f, q, cache, table, lens, RKV, None, softmax_scale=float("nan"), names=("softmax_scale",), **kw)
    # concat_and_cache_mla
    c = clmla.concat_and_cache_mla
    kv_c, k_pe = np.zeros((2, RKV), np.float32), np.zeros((2, DR), np.float32)
    slots = np.array([0, 5])
    for bad in ("fp8", "fp8_e4m3", "fp8_e5m2"):
        refused(c, kv_c, k_pe, cache, slots, bad, names=("kv_cache_dtype", repr(bad)), **kw)
    refused(c, kv_c, k_pe, cache, slots, "float16", names=("kv_cache_dtype",), **kw)
    refused(c, kv_c, k_pe, cache, slots, "fp8_ds_mla", names=("kv_cache", "uint8"), **kw)
    refused(c, kv_c, k_pe[:, :4], cache, slots, "auto", names=("kv_cache", "k_pe"), **kw)
    refused(c, kv_c, k_pe, cache, np.array([0, 64]), "auto", names=("slot_mapping",), **kw)
    refused(c, kv_c, k_pe, cache, np.array([3, 3]), "auto", names=("slot_mapping", "distinct"), **kw)
    refused(c, kv_c[:1], k_pe, cache, slots, "auto", names=("kv_c",), **kw)
    refused(c, kv_c.astype(np.int32), k_pe, cache, slots, "auto", names=("kv_c", "int32"), **kw)
    ro = cache.copy()
    ro.flags.writeable = False
    refused(c, kv_c, k_pe, ro, slots, "auto", names=("kv_cache", "read-only"), **kw)
    refused(c, kv_c, k_pe, cache[:, ::2], slots, "auto", names=("kv_cache", "contiguous"), **kw)
    refused(clmla.empty_kv_cache, 2, 16, 100, 16, "fp8", names=("kv_lora_rank",), context=ctx)
    refused(clmla.empty_kv_cache, 2, 16, 128, 16, "int4", names=("dtype",), context=ctx)


def test_ml_dtypes_arrays(ctx):
    """numpy arrays of ml_dtypes' bfloat16 and float8_e4m3fn are taken as their raw bits."""
    ml_dtypes = pytest.importorskip("ml_dtypes")
    rng = np.random.default_rng(61)
    cache = random_cache(rng, 3, 16, "bf16")
    assert cache.dtype == ml_dtypes.bfloat16                # empty_kv_cache's dtype where ml_dtypes is installed
    table, lens = np.array([[1, 2, 0]], np.int32), np.array([45], np.int32)
    q = queries(rng, 1, 2).astype(ml_dtypes.bfloat16)
    out, lse = clmla.flash_mla_with_kvcache(q, cache, table, lens, RKV, None, context=ctx)
    assert out.dtype == ml_dtypes.bfloat16
    bits = cache.view(np.uint16).copy()
    out2, lse2 = clmla.flash_mla_with_kvcache(q.astype(np.float32), bits, table, lens, RKV, None, context=ctx)
    assert np.array_equal(lse, lse2)
    assert np.array_equal(out.astype(np.float32), out2.astype(ml_dtypes.bfloat16).astype(np.float32))
    fp8 = random_cache(rng, 2, 16, "fp8")
    idx = random_indices(rng, 1, 2, 8, 32)
    o8, l8 = clmla.flash_mla_with_kvcache(q, fp8.view(ml_dtypes.float8_e4m3fn), None, None, RKV, None,
                                          is_fp8_kvcache=True, indices=idx, context=ctx)
    ref = ref_sparse(q.astype(np.float32), decode(fp8, "fp8", RKV, DR), idx, RKV, (RKV + DR) ** -0.5)
    assert np.max(np.abs(o8.astype(np.float64) - ref[0])) <= 2.0 ** -8 * np.max(np.abs(ref[0]))
    fin = np.isfinite(ref[1])
    assert np.array_equal(np.isfinite(l8), fin) and np.max(np.abs(l8[fin] - ref[1][fin])) <= TOL_LSE


# ---- torch -------------------------------------------------------------------------------------------------------

def test_torch_tensors(ctx):
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(41)
    bs, num_blocks, n = 16, 3, 30
    cache = torch.zeros((num_blocks, bs, 1, RKV + DR), dtype=torch.bfloat16)
    table = torch.tensor([[2, 0]], dtype=torch.int32)
    x = torch.from_numpy(rng.standard_normal((n, RKV + DR)).astype(np.float32))
    slots = torch.tensor([table[0, j // bs].item() * bs + j % bs for j in range(n)], dtype=torch.int64)
    ptr = cache.data_ptr()
    clmla.concat_and_cache_mla(x[:, :RKV].to(torch.bfloat16), x[:, RKV:], cache, slots, "auto", None, context=ctx)
    assert cache.data_ptr() == ptr
    bits = cache.view(torch.int16).numpy().view(np.uint16)
    rows = decode(bits, "bf16", RKV, DR)
    q = torch.from_numpy(queries(rng, 1, 2)).to(torch.bfloat16)
    out, lse = clmla.flash_mla_with_kvcache(q, cache, table, torch.tensor([n], dtype=torch.int32), RKV, None,
                                            causal=True, context=ctx)
    assert isinstance(out, torch.Tensor) and out.dtype == torch.bfloat16 and lse.dtype == torch.float32
    assert tuple(lse.shape) == (1, H, 2)
    qf = q.float().numpy()
    ref_out, ref_lse = ref_dense(qf, rows, table.numpy(), [n], bs, RKV, (RKV + DR) ** -0.5, True)
    assert np.max(np.abs(out.float().numpy() - ref_out)) <= 2 ** -7 * np.max(np.abs(ref_out))
    assert np.max(np.abs(lse.numpy() - ref_lse)) <= TOL_LSE
    fp8 = torch.zeros((2, bs, 1, row_size("fp8", RKV, DR)), dtype=torch.uint8)
    clmla.concat_and_cache_mla(x[:4, :RKV], x[:4, RKV:], fp8, torch.tensor([0, 1, 2, 3]), "fp8_ds_mla",
                               context=ctx)
    assert within_rounding("fp8", decode(fp8.numpy(), "fp8", RKV, DR)[:4], x[:4].double().numpy())


def test_status_clean_after_valid_calls(ctx):
    """Valid tables set none of the device-side CLMLA_PAGED_BAD_* flags, whatever the batch size."""
    rng = np.random.default_rng(51)
    cache = random_cache(rng, 8, 16, "f32")
    clmla.paged_status(ctx)
    for B in range(1, 8):
        table = np.tile(np.arange(8, dtype=np.int32)[::-1], (B, 1))
        lens = rng.integers(0, 129, B).astype(np.int32)
        for S in (1, 3):
            clmla.flash_mla_with_kvcache(queries(rng, B, S), cache, table, lens, RKV, None, causal=S > 1, context=ctx)
            assert clmla.paged_status(ctx) == set(), (B, S)


# ---- the indexer's selection --------------------------------------------------------------------------------------

@pytest.mark.parametrize("bs,S,causal,top_k", [(16, 1, False, 8), (5, 3, True, 20), (1, 2, True, 64)])
def test_indexer_select_against_float64(bs, S, causal, top_k):
    rng = np.random.default_rng(bs + S)
    lens, D, HI = [37, 1, 70], 32, 4
    nb = sum(-(-n // bs) for n in lens) + 2
    table = scattered_tables(rng, lens, bs, nb)
    keys = rng.standard_normal((nb, bs, D)).astype(np.float32)
    q = rng.standard_normal((len(lens), S, HI, D)).astype(np.float32)
    w = rng.uniform(0.1, 1.0, (len(lens), S, HI)).astype(np.float32)
    got = clmla.indexer_select(q, w, keys, table, np.array(lens, np.int32), top_k, causal=causal)
    slots = clmla.indexer_select(q, w, keys, table, np.array(lens, np.int32), top_k, causal=causal, slots=True)
    assert got.shape == (len(lens), S, top_k) and got.dtype == np.int32
    flat = keys.reshape(-1, D).astype(np.float64)
    for b, n_all in enumerate(lens):
        pos_slot = np.array([table[b, j // bs] * bs + j % bs for j in range(n_all)], np.int64)
        for i in range(S):
            n = max(n_all - S + i + 1, 0) if causal else n_all
            score = (np.maximum(q[b, i].astype(np.float64) @ flat[pos_slot[:n]].T, 0.0) * w[b, i, :, None]).sum(0)
            row, k = got[b, i], min(top_k, n)
            assert np.all(row[k:] == -1) and np.all(np.diff(row[:k]) > 0), row
            taken = np.zeros(n, bool)
            taken[row[:k]] = True
            if k < n:   # nothing left out scores above what was taken
                assert score[~taken].max() <= score[taken].min() + 1e-5 * np.abs(score).max()
            assert np.array_equal(slots[b, i, :k], pos_slot[row[:k]]) and np.all(slots[b, i, k:] == -1)


def test_indexer_select_refusals():
    rng = np.random.default_rng(3)
    keys = rng.standard_normal((4, 16, 32)).astype(np.float32)
    q = rng.standard_normal((1, 1, 4, 32)).astype(np.float32)
    w = np.ones((1, 1, 4), np.float32)
    table, lens = np.array([[0, 1]], np.int32), np.array([20], np.int32)
    with pytest.raises(clmla.Error, match="weights must be"):
        clmla.indexer_select(q, w[:, :, :2], keys, table, lens, 4)
    with pytest.raises(clmla.Error, match="index_head_dim 32"):
        clmla.indexer_select(q, w, np.ascontiguousarray(keys[:, :, :16]), table, lens, 4)
    with pytest.raises(clmla.Error, match=r"block_table\[0\]\[1\] = 9"):
        clmla.indexer_select(q, w, keys, np.array([[0, 9]], np.int32), lens, 4)
    with pytest.raises(clmla.Error, match="top_k"):
        clmla.indexer_select(q, w, keys, table, lens, 0)


# ---- a FlashMLA call site, with only the import changed -----------------------------------------------------------

def test_flashmla_call_site_with_clmla_import():
    """FlashMLA's documented decode loop on CPU torch tensors (bf16 q and cache, blocks of 64,
    heads_k 1, causal seqlen_q 2), written against FlashMLA's API; only the import names clmla.
    Checked against a float32 torch computation of FlashMLA's documented semantics."""
    torch = pytest.importorskip("torch")
    from clmla import flash_mla_with_kvcache, get_mla_metadata   # was: from flash_mla import ...

    b, s_q, h_q, h_kv, d, dv, block_size = 3, 2, 16, 1, 576, 512, 64
    cache_seqlens = torch.tensor([200, 64, 131], dtype=torch.int32)
    max_blocks = (int(cache_seqlens.max()) + block_size - 1) // block_size
    g = torch.Generator().manual_seed(7)
    block_table = torch.randperm(b * max_blocks, generator=g).to(torch.int32).view(b, max_blocks)
    blocked_k = torch.randn(b * max_blocks, block_size, h_kv, d, generator=g).to(torch.bfloat16)
    q = torch.randn(b, s_q, h_q, d, generator=g).to(torch.bfloat16)

    tile_scheduler_metadata, num_splits = get_mla_metadata(cache_seqlens, s_q * h_q // h_kv, h_kv)
    out, lse = flash_mla_with_kvcache(q, blocked_k, block_table, cache_seqlens, dv, tile_scheduler_metadata,
                                      num_splits, causal=True)
    assert out.shape == (b, s_q, h_q, dv) and out.dtype == torch.bfloat16
    assert lse.shape == (b, h_q, s_q) and lse.dtype == torch.float32

    scale = d ** -0.5
    for i in range(b):
        n = int(cache_seqlens[i])
        rows = blocked_k[block_table[i].long()].reshape(-1, d)[:n].float()
        for j in range(s_q):
            visible = n - s_q + j + 1
            s = (q[i, j].float() @ rows[:visible].T) * scale          # [h_q, visible]
            want_lse = torch.logsumexp(s, dim=-1)
            want = torch.softmax(s, dim=-1) @ rows[:visible, :dv]
            assert torch.allclose(lse[i, :, j], want_lse, atol=1e-4)
            err = float((out[i, j].float() - want).abs().max() / want.abs().max())
            assert err <= 2 ** -7, err                                   # out rounded to bf16
