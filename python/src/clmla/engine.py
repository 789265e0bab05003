"""Attention over a caller's paged latent cache, under the names and signatures engines call:
FlashMLA's ``get_mla_metadata`` and ``flash_mla_with_kvcache``, vLLM's ``concat_and_cache_mla``,
on numpy arrays and CPU torch tensors (the clmla_paged_* calls of include/clmla.h). The cache
stays in the caller's memory: its address is handed to the library, which uses it in place where
the device shares host memory and the address is aligned (``empty_kv_cache`` makes such caches).
See python/README.md, "Use from an engine"."""

from __future__ import annotations

import atexit
import ctypes
import math
import sys
import threading
import weakref
from typing import Tuple

import numpy as np

from ._binding import CONST, STRUCTS, lib
from ._core import _Owned, _check, _ctx, _int, _invalid, _is_torch

__all__ = ["FlashMLASchedMeta", "get_mla_metadata", "flash_mla_with_kvcache", "concat_and_cache_mla",
           "indexer_select", "empty_kv_cache", "paged_info", "paged_status"]

_SHAPE = "CLMLA_ERROR_SHAPE_MISMATCH"
_F32, _F16, _BF16, _FP8 = (CONST["CLMLA_CACHE_F32"], CONST["CLMLA_CACHE_F16"], CONST["CLMLA_CACHE_BF16"],
                           CONST["CLMLA_CACHE_FP8"])
_DTYPES = {"f32": _F32, "f16": _F16, "bf16": _BF16, "fp8": _FP8}
_DTYPE_NAMES = {v: k for k, v in _DTYPES.items()}
# element type names (numpy's dtype.name, torch's dtype without "torch.") of float caches
_FLOAT_CACHE = {"float32": _F32, "float16": _F16, "bfloat16": _BF16, "uint16": _BF16}
# element types an fp8 cache may be given as: its bytes
_FP8_BYTES = ("uint8", "int8", "float8_e4m3fn")
_INT32_MIN, _INT32_MAX = -2 ** 31, 2 ** 31 - 1
_MAX_TOPK = CONST["CLMLA_SPARSE_MAX_TOPK"]
_BAD_FLAGS = {"bad_block": CONST["CLMLA_PAGED_BAD_BLOCK"], "bad_length": CONST["CLMLA_PAGED_BAD_LENGTH"],
              "bad_slot": CONST["CLMLA_PAGED_BAD_SLOT"]}


# ---- one clmla_paged per layout and context ----------------------------------------------------------------------

class _Paged(_Owned):
    """A clmla_paged: the kernels of one cache layout (rkv, dr, block_size, dtype) on one context."""

    _destroy = staticmethod(lambda h: lib.clmla_paged_destroy(h))

    def __init__(self, ctx, layout: Tuple[int, ...]):
        cfg = STRUCTS["clmla_paged_config"]()
        cfg.kv_lora_rank, cfg.rope_dim, cfg.block_size, cfg.dtype = layout[:4]
        if len(layout) > 4:
            cfg.index_head_dim, cfg.index_dtype = layout[4:]
        ch = ctx._require()
        h = ctypes.c_void_p()
        _check(lib.clmla_paged_create(ch, ctypes.byref(cfg), ctypes.byref(h)), ch)
        self._handle = h.value
        self.layout = layout
        self._context = weakref.ref(ctx)
        ctx._adopt(self)
        _every_paged.add(self)
        self.alignment = max(1, self.info()["host_alignment"])

    def close(self) -> None:
        """Destroys the clmla_paged while its context lives; one whose context is already gone
        (collected without closing it) is only forgotten, as the library's context is freed."""
        ctx = self._context()
        if self._handle and (ctx is None or ctx.closed):
            self._handle = None
            return
        super().close()

    def info(self) -> dict:
        i = STRUCTS["clmla_paged_info"]()
        _check(lib.clmla_paged_get_info(self._require(), ctypes.byref(i)))
        return {f: int(getattr(i, f)) for f, _ in i._fields_}


# Context -> {layout: _Paged}. Nothing here holds a context: a context that goes away closes its
# _Paged objects first (Context.close closes what it adopted), and its entry leaves the map.
_layouts: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
_layouts_lock = threading.Lock()
_every_paged: "weakref.WeakSet" = weakref.WeakSet()


def _paged(ctx, rkv: int, dr: int, block_size: int, dtype: int, index_head_dim: int = 0,
           index_dtype: int = 0) -> _Paged:
    layout = (rkv, dr, block_size, dtype) + ((index_head_dim, index_dtype) if index_head_dim else ())
    with _layouts_lock:
        per_ctx = _layouts.setdefault(ctx, {})
        p = per_ctx.get(layout)
        if p is None or p.closed:
            p = per_ctx[layout] = _Paged(ctx, layout)
        return p


@atexit.register
def _close_every_paged():
    """Destroys the layouts while the library and their contexts are still there."""
    for p in list(_every_paged):
        try:
            p.close()
        except Exception:
            pass


# ---- memory of arrays and tensors ----------------------------------------------------------------------------------

class _Mem:
    """An array's or CPU tensor's memory as the library sees it: address, size, shape, element
    type name ("float32", "bfloat16", "uint8", ...), contiguity and writability."""

    def __init__(self, x, what: str):
        if _is_torch(x):
            if x.device.type != "cpu":
                _invalid("%s is on %s: clmla takes CPU tensors (call .cpu())" % (what, x.device))
            self.ptr, self.nbytes = x.data_ptr(), x.numel() * x.element_size()
            self.base = x.untyped_storage().data_ptr()
            self.shape, self.dtype = tuple(x.shape), str(x.dtype).replace("torch.", "")
            self.contiguous, self.writeable = x.is_contiguous(), True
        elif isinstance(x, np.ndarray):
            self.ptr, self.nbytes = x.ctypes.data, x.nbytes
            root = x
            while isinstance(root.base, np.ndarray):
                root = root.base
            self.base = root.ctypes.data
            self.shape, self.dtype = tuple(x.shape), x.dtype.name
            self.contiguous, self.writeable = x.flags.c_contiguous, x.flags.writeable
        else:
            _invalid("%s must be a numpy array or a CPU torch tensor, not %r" % (what, type(x).__name__))
        self.what = what


def _numpy(x, what: str) -> np.ndarray:
    """Tables and small vectors: a numpy array (CPU tensors through .numpy(), lists through asarray)."""
    if _is_torch(x):
        if x.device.type != "cpu":
            _invalid("%s is on %s: clmla takes CPU tensors (call .cpu())" % (what, x.device))
        x = x.detach()
        if x.dtype.is_floating_point and x.element_size() < 4:
            x = x.float()
        return x.contiguous().numpy()
    try:
        return np.asarray(x)
    except Exception as e:
        _invalid("%s cannot be read as an array: %s" % (what, e))


def _int32(x, what: str, ndim: int) -> np.ndarray:
    """An integer table as a C-contiguous int32 array of ndim dimensions; values must fit int32."""
    a = _numpy(x, what)
    if a.dtype.kind not in "iu":
        _invalid("%s must hold integers (int32), not %s" % (what, a.dtype))
    if a.ndim != ndim:
        _invalid("%s must have %d dimensions, not shape %s" % (what, ndim, list(a.shape)), _SHAPE)
    if a.dtype != np.int32 and a.size:
        lo, hi = int(a.min()), int(a.max())
        if lo < _INT32_MIN or hi > _INT32_MAX:
            _invalid("%s holds %d, outside int32" % (what, lo if lo < _INT32_MIN else hi))
    return np.ascontiguousarray(a, dtype=np.int32)


def _aligned(shape, dtype, alignment: int) -> np.ndarray:
    """An uninitialised C-contiguous array whose data starts at a multiple of alignment bytes."""
    dtype = np.dtype(dtype)
    n = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    raw = np.empty(n + alignment, np.uint8)
    start = (-raw.ctypes.data) % alignment
    return raw[start: start + n].view(dtype).reshape(shape)


def _aligned_copy(a: np.ndarray, alignment: int) -> np.ndarray:
    if a.flags.c_contiguous and a.ctypes.data % alignment == 0:
        return a
    out = _aligned(a.shape, a.dtype, alignment)
    out[...] = a
    return out


def _host(buf, ptr: int, nbytes: int) -> None:
    """Points a clmla_buffer at host memory."""
    buf.mem, buf.host, buf.offset, buf.bytes = None, ptr, 0, nbytes


def _host_cache(buf, m: "_Mem", alignment: int) -> None:
    """Points a clmla_buffer at a cache: from the last multiple of the device's alignment at or
    before it that is still in its allocation, and its offset from there where that is a multiple
    of 16 bytes, so that a cache inside a larger array (a layer's part of one engine-wide tensor) is
    used in place; else from its own start."""
    start = m.ptr - m.ptr % alignment
    if start < m.base or (m.ptr - start) % 16:
        start = m.ptr
    buf.mem, buf.host, buf.offset, buf.bytes = None, start, m.ptr - start, m.nbytes


def _host_array(buf, a: np.ndarray) -> None:
    _host(buf, a.ctypes.data, a.nbytes)


# ---- cache layouts -------------------------------------------------------------------------------------------------

def _row_size(dtype: int, rkv: int, dr: int) -> int:
    """Elements of one row as the cache array holds them (bytes for fp8)."""
    return rkv + rkv // 32 + 2 * dr if dtype == _FP8 else rkv + dr


def _cache_geometry(m: _Mem, fp8: bool, fp8_hint: str) -> Tuple[int, int, int, int]:
    """(num_blocks, block_size, row elements, clmla dtype) of a cache [num_blocks, block_size, (1,) row]."""
    what = m.what
    if len(m.shape) == 4:
        if m.shape[2] != 1:
            _invalid("%s %s has %d heads (axis 2): heads_k must be 1" % (what, list(m.shape), m.shape[2]), _SHAPE)
        nb, bs, row = m.shape[0], m.shape[1], m.shape[3]
    elif len(m.shape) == 3:
        nb, bs, row = m.shape
    else:
        _invalid("%s must be [num_blocks, block_size, 1, row] or [num_blocks, block_size, row], not %s" % (
            what, list(m.shape)), _SHAPE)
    if nb < 1 or bs < 1 or row < 1:
        _invalid("%s %s is empty" % (what, list(m.shape)), _SHAPE)
    if fp8:
        if m.dtype not in _FP8_BYTES:
            _invalid("%s has dtype %s: an fp8 cache holds bytes (uint8, int8 or float8_e4m3fn)" % (what, m.dtype))
        dtype = _FP8
    else:
        dtype = _FLOAT_CACHE.get(m.dtype)
        if dtype is None:
            hint = " (an fp8 cache: %s)" % fp8_hint if m.dtype in _FP8_BYTES else ""
            _invalid("%s has dtype %s: a cache of float32, float16 or bfloat16 (bfloat16 bits as uint16)%s" % (
                what, m.dtype, hint))
    if not m.contiguous:
        _invalid("%s %s must be contiguous (blocks of packed rows): clmla reads it in place" % (what, list(m.shape)))
    return nb, bs, row, dtype


def _check_row(what: str, m: _Mem, row: int, dtype: int, rkv: int, dr: int, source: str) -> None:
    if dtype == _FP8 and rkv % 128:
        _invalid("an fp8 cache needs kv_lora_rank a multiple of 128, not %d (%s)" % (rkv, source), _SHAPE)
    want = _row_size(dtype, rkv, dr)
    if row != want:
        unit = "bytes" if dtype == _FP8 else "values"
        _invalid("%s %s has rows of %d %s; %s needs %d (%s: %d + %d)" % (
            what, list(m.shape), row, unit, source, want, _DTYPE_NAMES[dtype], rkv, dr), _SHAPE)


# ---- FlashMLA ----------------------------------------------------------------------------------------------------

class FlashMLASchedMeta:
    """What get_mla_metadata returns: clmla splits the keys of each call itself, so this holds
    nothing, and flash_mla_with_kvcache accepts it (or anything else) and ignores it."""

    def __repr__(self):
        return "<clmla.engine.FlashMLASchedMeta>"


def get_mla_metadata(*args, **kwargs) -> Tuple[FlashMLASchedMeta, None]:
    """FlashMLA's get_mla_metadata: any arguments (the old ``(cache_seqlens, s_q * h_q // h_k,
    h_k)`` included); returns ``(FlashMLASchedMeta(), None)``."""
    return FlashMLASchedMeta(), None


def _query(q):
    """q as float32 numpy, and the function giving an output back in q's kind and dtype."""
    if _is_torch(q):
        torch = sys.modules["torch"]
        if q.device.type != "cpu":
            _invalid("q is on %s: clmla takes CPU tensors (call .cpu())" % q.device)
        if not q.dtype.is_floating_point or q.element_size() == 1:
            _invalid("q has dtype %s: give float32, float16, bfloat16 or float64" % q.dtype)
        dt = q.dtype
        return q.detach().to(torch.float32).numpy(), (lambda a: torch.from_numpy(a).to(dt)), \
            (lambda a: torch.from_numpy(a))
    if not isinstance(q, np.ndarray):
        _invalid("q must be a numpy array or a CPU torch tensor, not %r" % type(q).__name__)
    if not ((q.dtype.kind == "f" and q.dtype.itemsize in (2, 4, 8)) or q.dtype.name == "bfloat16"):
        _invalid("q has dtype %s: give float32, float16, bfloat16 or float64" % q.dtype)
    dt = q.dtype
    return q.astype(np.float32, copy=False), (lambda a: a if dt == np.float32 else a.astype(dt)), (lambda a: a)


def _dims(head_dim_v, D: int, fp8: bool) -> Tuple[int, int]:
    """(rkv, dr) from head_dim_v and q's last dim."""
    rkv = _int(head_dim_v, "head_dim_v", 1)
    if rkv > D:
        _invalid("head_dim_v %d is more than q's last dim %d (rkv + dr)" % (rkv, D), _SHAPE)
    dr = D - rkv
    if dr % 2:
        _invalid("head_dim_v %d leaves an odd rope dim %d of q's last dim %d: rope_dim must be even" % (rkv, dr, D),
                 _SHAPE)
    if fp8 and rkv % 128:
        _invalid("head_dim_v %d: an fp8 cache needs it a multiple of 128" % rkv, _SHAPE)
    return rkv, dr


def _scale(softmax_scale, D: int) -> float:
    if softmax_scale is None:
        return D ** -0.5
    if isinstance(softmax_scale, bool) or not isinstance(softmax_scale, (int, float, np.integer, np.floating)):
        _invalid("softmax_scale must be a number, not %r" % type(softmax_scale).__name__)
    s = float(softmax_scale)
    if not math.isfinite(s) or s == 0.0:
        _invalid("softmax_scale must be finite and nonzero, not %r" % s)
    return s


def _dense_tables(block_table, cache_seqlens, B: int, bs: int):
    if block_table is None or cache_seqlens is None:
        _invalid("block_table and cache_seqlens are required without indices (dense attention)")
    bt = _int32(block_table, "block_table", 2)
    if bt.shape[0] != B or bt.shape[1] < 1:
        _invalid("block_table must be [batch %d, max_blocks >= 1], not %s" % (B, list(bt.shape)), _SHAPE)
    lens = _int32(cache_seqlens, "cache_seqlens", 1)
    if lens.shape != (B,):
        _invalid("cache_seqlens must be [batch %d], not %s" % (B, list(lens.shape)), _SHAPE)
    cap = bt.shape[1] * bs
    bad = np.flatnonzero((lens < 0) | (lens > cap))
    if bad.size:
        i = int(bad[0])
        _invalid("cache_seqlens[%d] = %d is outside 0 .. %d (block_table %s: %d blocks of %d tokens)" % (
            i, lens[i], cap, list(bt.shape), bt.shape[1], bs))
    return bt, lens


def _sparse_indices(indices, length, B: int, S: int, what: str, length_what: str) -> np.ndarray:
    """indices [B, S, topk] as int32 cache slots; entries past length[b] (when given) become -1."""
    a = _numpy(indices, what)
    if a.dtype.kind not in "iu":
        _invalid("%s must hold integers (int32), not %s" % (what, a.dtype))
    if a.ndim != 3 or a.shape[:2] != (B, S) or not 1 <= a.shape[2] <= _MAX_TOPK:
        _invalid("%s must be [batch %d, seqlen_q %d, topk 1..%d], not %s" % (what, B, S, _MAX_TOPK, list(a.shape)),
                 _SHAPE)
    # any value outside the cache is no key: clipping to int32 keeps it outside
    idx = np.clip(a, _INT32_MIN if a.dtype.kind == "i" else 0, _INT32_MAX).astype(np.int32)
    if length is not None:
        n = _int32(length, length_what, 1)
        if n.shape != (B,):
            _invalid("%s must be [batch %d], not %s" % (length_what, B, list(n.shape)), _SHAPE)
        idx[np.broadcast_to(np.arange(a.shape[2])[None, None, :] >= n[:, None, None], idx.shape)] = -1
    return np.ascontiguousarray(idx)


def _attend(ctx, q: np.ndarray, rkv: int, dr: int, cache, what: str, fp8: bool, scale: float, causal: bool,
            tables=None, indices=None):
    """One clmla_paged_attention call: out [B, S, H, rkv] and lse [B, S, H] float32."""
    m = _Mem(cache, what)
    nb, bs, row, dtype = _cache_geometry(m, fp8, "pass is_fp8_kvcache=True")
    _check_row(what, m, row, dtype, rkv, dr, "q [.., %d] with head_dim_v %d" % (rkv + dr, rkv))
    p = _paged(ctx, rkv, dr, bs, dtype)
    al = p.alignment
    B, S, H, _ = q.shape
    a = STRUCTS["clmla_paged_attention_args"]()
    a.batch, a.seqlen_q, a.num_heads, a.softmax_scale, a.causal = B, S, H, scale, int(bool(causal))
    qa = _aligned_copy(q, al)
    _host_array(a.q, qa)
    _host_cache(a.kv_cache, m, al)
    a.num_blocks = nb
    if indices is None:
        bt, lens = _dense_tables(tables[0], tables[1], B, bs)
        bt, lens = _aligned_copy(bt, al), _aligned_copy(lens, al)
        _host_array(a.block_table, bt)
        _host_array(a.cache_seqlens, lens)
        a.max_blocks, a.max_seqlen = bt.shape[1], int(lens.max())
    else:
        # slot indices: block_table and cache_seqlens are not read
        indices = _aligned_copy(indices, al)
        _host_array(a.indices, indices)
        a.topk, a.indices_kind = indices.shape[2], CONST["CLMLA_PAGED_INDICES_SLOTS"]
    out = _aligned((B, S, H, rkv), np.float32, al)
    lse = _aligned((B, S, H), np.float32, al)
    _host_array(a.out, out)
    _host_array(a.lse, lse)
    _check(lib.clmla_paged_attention(p._require(), ctypes.byref(a), None), ctx._handle)
    return out, lse


def _merge(o1, l1, o2, l2):
    """Two attentions over disjoint key sets, combined by their log-sum-exps (float32 out)."""
    m = np.maximum(l1, l2).astype(np.float64)
    some = np.isfinite(m)
    base = np.where(some, m, 0.0)
    w1, w2 = np.exp(l1 - base), np.exp(l2 - base)
    total = w1 + w2
    lse = np.where(some, base + np.log(np.where(some, total, 1.0)), -np.inf).astype(np.float32)
    out = (o1 * w1[..., None] + o2 * w2[..., None]) / np.where(total > 0, total, 1.0)[..., None]
    return out.astype(np.float32), lse


def _apply_sink(out, lse, attn_sink, H: int):
    sink = _numpy(attn_sink, "attn_sink")
    if sink.dtype.kind not in "fiu" or sink.shape != (H,):
        _invalid("attn_sink must be [num_heads_q %d] float32, not %s %s" % (H, sink.dtype, list(sink.shape)), _SHAPE)
    with np.errstate(over="ignore"):
        factor = 1.0 / (1.0 + np.exp(sink.astype(np.float64) - lse.astype(np.float64)))
    return (out * factor[..., None]).astype(np.float32)


def flash_mla_with_kvcache(q, k_cache, block_table, cache_seqlens, head_dim_v, tile_scheduler_metadata,
                           num_splits=None, softmax_scale=None, causal=False, is_fp8_kvcache=False, indices=None,
                           attn_sink=None, extra_k_cache=None, extra_indices_in_kvcache=None, topk_length=None,
                           extra_topk_length=None, *, context=None):
    """FlashMLA's decode attention over a paged latent cache, on the host (blocking).

    ``q [batch, seqlen_q, heads_q, rkv + dr]`` (q~ then q^R; any float dtype, computed in float32),
    ``k_cache [num_blocks, block_size, 1, row]`` or ``[num_blocks, block_size, row]``: float32,
    float16 or bfloat16 rows of rkv + dr values, or with ``is_fp8_kvcache`` FlashMLA's fp8 rows
    (bytes: rkv e4m3 codes, rkv / 128 float32 scales, dr bfloat16), used in place.
    ``head_dim_v`` = rkv. Dense: ``block_table [batch, max_blocks]`` and ``cache_seqlens [batch]``
    (int32), ``causal`` as FlashMLA. Sparse: ``indices [batch, seqlen_q, topk]`` cache slots
    (block * block_size + offset; -1 or outside the cache: no key), ``topk_length [batch]``,
    ``extra_k_cache`` with ``extra_indices_in_kvcache`` (and ``extra_topk_length``) as a second key
    set. ``attn_sink [heads_q]`` scales out by exp(lse) / (exp(lse) + exp(sink)).
    ``tile_scheduler_metadata`` and ``num_splits`` are ignored. Returns ``(out [batch, seqlen_q,
    heads_q, rkv] in q's dtype, softmax_lse [batch, heads_q, seqlen_q] float32)``, torch tensors
    for a torch q. ``context``: a clmla.Context (None: clmla.default_context())."""
    ctx = _ctx(context)
    qf, as_q, as_lse = _query(q)
    if qf.ndim != 4 or 0 in qf.shape:
        _invalid("q must be [batch, seqlen_q, heads_q, head_dim] with no empty axis, not %s" % list(qf.shape), _SHAPE)
    B, S, H, D = qf.shape
    fp8 = bool(is_fp8_kvcache)
    rkv, dr = _dims(head_dim_v, D, fp8)
    scale = _scale(softmax_scale, D)
    sparse = indices is not None
    if sparse and causal:
        _invalid("causal must be False with indices (sparse attention), as in FlashMLA")
    if not sparse:
        for name, v in (("topk_length", topk_length), ("extra_k_cache", extra_k_cache),
                        ("extra_indices_in_kvcache", extra_indices_in_kvcache),
                        ("extra_topk_length", extra_topk_length)):
            if v is not None:
                _invalid("%s is for sparse attention: give indices too" % name)
    if (extra_k_cache is None) != (extra_indices_in_kvcache is None):
        _invalid("extra_k_cache and extra_indices_in_kvcache go together: give both or neither")
    if extra_topk_length is not None and extra_k_cache is None:
        _invalid("extra_topk_length needs extra_k_cache and extra_indices_in_kvcache")
    if not sparse:
        out, lse = _attend(ctx, qf, rkv, dr, k_cache, "k_cache", fp8, scale, causal,
                           tables=(block_table, cache_seqlens))
    else:
        idx = _sparse_indices(indices, topk_length, B, S, "indices", "topk_length")
        out, lse = _attend(ctx, qf, rkv, dr, k_cache, "k_cache", fp8, scale, False, indices=idx)
        if extra_k_cache is not None:
            eidx = _sparse_indices(extra_indices_in_kvcache, extra_topk_length, B, S, "extra_indices_in_kvcache",
                                   "extra_topk_length")
            o2, l2 = _attend(ctx, qf, rkv, dr, extra_k_cache, "extra_k_cache", fp8, scale, False, indices=eidx)
            out, lse = _merge(out, lse, o2, l2)
    if attn_sink is not None:
        out = _apply_sink(out, lse, attn_sink, H)
    return as_q(out), as_lse(np.ascontiguousarray(lse.transpose(0, 2, 1)))


# ---- vLLM's cache write --------------------------------------------------------------------------------------------

def _float_rows(x, what: str, T: int):
    """The first T rows of a 2-D float array or tensor as (owner, address, row stride in floats,
    bytes, width): float32 rows with a unit inner stride are used in place, the rest converted."""
    if _is_torch(x):
        if x.device.type != "cpu":
            _invalid("%s is on %s: clmla takes CPU tensors (call .cpu())" % (what, x.device))
        if not x.dtype.is_floating_point or x.element_size() == 1:
            _invalid("%s has dtype %s: give float32, float16, bfloat16 or float64" % (what, x.dtype))
        if x.dim() != 2 or x.shape[0] < T:
            _invalid("%s must be [num_tokens >= %d, width], not %s" % (what, T, list(x.shape)), _SHAPE)
        x = x.detach()[:T]
        if str(x.dtype) == "torch.float32" and x.stride(1) == 1 and x.stride(0) >= x.shape[1]:
            w, s = x.shape[1], x.stride(0)
            return x, x.data_ptr(), s, ((T - 1) * s + w) * 4, w
        x = x.float().contiguous().numpy()
    elif not isinstance(x, np.ndarray):
        _invalid("%s must be a numpy array or a CPU torch tensor, not %r" % (what, type(x).__name__))
    if not ((x.dtype.kind == "f" and x.dtype.itemsize in (2, 4, 8)) or x.dtype.name == "bfloat16"):
        _invalid("%s has dtype %s: give float32, float16, bfloat16 or float64" % (what, x.dtype))
    if x.ndim != 2 or x.shape[0] < T:
        _invalid("%s must be [num_tokens >= %d, width], not %s" % (what, T, list(x.shape)), _SHAPE)
    x = x[:T]
    w = x.shape[1]
    if x.dtype == np.float32 and x.strides[1] == 4 and x.strides[0] % 4 == 0 and x.strides[0] // 4 >= w:
        s = x.strides[0] // 4
    else:
        x, s = np.ascontiguousarray(x, dtype=np.float32), w
    return x, x.ctypes.data, s, ((T - 1) * s + w) * 4, w


def concat_and_cache_mla(kv_c, k_pe, kv_cache, slot_mapping, kv_cache_dtype, scale=None, *, context=None) -> None:
    """vLLM's concat_and_cache_mla: token t's ``kv_c[t]`` (rkv values) and ``k_pe[t]`` (dr values)
    into row ``slot_mapping[t]`` of ``kv_cache [num_blocks, block_size, (1,) row]``, in place
    (-1: skip the token). ``kv_cache_dtype``: ``"auto"`` (the cache's own float32, float16 or
    bfloat16) or ``"fp8_ds_mla"`` (FlashMLA's fp8 rows of bytes). ``scale`` is ignored. Blocking;
    returns None."""
    ctx = _ctx(context)
    if kv_cache_dtype == "auto":
        fp8 = False
    elif kv_cache_dtype == "fp8_ds_mla":
        fp8 = True
    elif isinstance(kv_cache_dtype, str) and kv_cache_dtype.startswith("fp8"):
        _invalid("kv_cache_dtype %r (vLLM's fp8 cache with a per-tensor scale) is not supported: "
                 "use 'auto' or 'fp8_ds_mla'" % kv_cache_dtype)
    else:
        _invalid("kv_cache_dtype must be 'auto' or 'fp8_ds_mla', not %r" % (kv_cache_dtype,))
    slots = _int32(slot_mapping, "slot_mapping", 1)
    T = slots.shape[0]
    if _is_torch(k_pe) and k_pe.dim() == 3 and k_pe.shape[1] == 1:
        k_pe = k_pe[:, 0]
    elif isinstance(k_pe, np.ndarray) and k_pe.ndim == 3 and k_pe.shape[1] == 1:
        k_pe = k_pe[:, 0]
    m = _Mem(kv_cache, "kv_cache")
    nb, bs, row, dtype = _cache_geometry(m, fp8, "kv_cache_dtype='fp8_ds_mla'")
    if not m.writeable:
        _invalid("kv_cache is read-only: it is written in place")
    if T == 0:
        return None
    kv_keep, kv_ptr, kv_stride, kv_bytes, rkv = _float_rows(kv_c, "kv_c", T)
    pe_keep, pe_ptr, pe_stride, pe_bytes, dr = _float_rows(k_pe, "k_pe", T)
    _check_row("kv_cache", m, row, dtype, rkv, dr, "kv_c [.., %d] with k_pe [.., %d]" % (rkv, dr))
    valid = slots[slots >= 0]
    if np.unique(valid).size != valid.size:
        _invalid("slot_mapping gives slot %d to tokens %d and %d: slots must be distinct" % _first_duplicate(slots))
    p = _paged(ctx, rkv, dr, bs, dtype)
    slots = _aligned_copy(slots, p.alignment)
    a = STRUCTS["clmla_paged_write_args"]()
    a.num_tokens = T
    _host(a.kv_c, kv_ptr, kv_bytes)
    a.kv_c_stride = kv_stride
    _host(a.k_pe, pe_ptr, pe_bytes)
    a.k_pe_stride = pe_stride
    _host_array(a.slot_mapping, slots)
    _host(a.kv_cache, m.ptr, m.nbytes)
    a.num_blocks = nb
    _check(lib.clmla_paged_write(p._require(), ctypes.byref(a), None), ctx._handle)
    del kv_keep, pe_keep
    return None


def _first_duplicate(slots: np.ndarray) -> Tuple[int, int, int]:
    first = {}
    for t, s in enumerate(slots.tolist()):
        if s >= 0:
            if s in first:
                return s, first[s], t
            first[s] = t
    raise AssertionError("no duplicate slot")


# ---- DeepSeek Sparse Attention's selection ---------------------------------------------------------------------------

def indexer_select(q, weights, index_cache, block_table, cache_seqlens, top_k: int, *, causal: bool = False,
                   index_dtype: str = "f32", slots: bool = False, context=None):
    """The lightning indexer's top-k over a paged index-key cache (clmla_paged_index_select,
    blocking): query ``(b, i)`` scores each position s it sees (all ``cache_seqlens[b]``, or with
    ``causal`` the first ``cache_seqlens[b] - seqlen_q + i + 1``) as ``sum_h weights[b, i, h] *
    max(q[b, i, h] . k_s, 0)`` and gets the ``min(top_k, visible)`` best positions in ascending
    order, then -1. ``q [batch, seqlen_q, heads, index_head_dim]`` float (after RoPE), ``weights
    [batch, seqlen_q, heads]`` (with the indexer's scale), ``index_cache`` one layer's index keys,
    paged by the blocks of ``block_table [batch, max_blocks]``: ``[num_blocks, block_size,
    index_head_dim]`` of float32, float16 or bfloat16 (``index_dtype`` "f32", "f16", "bf16"), or for
    "fp8" bytes ``[num_blocks, block_size * (index_head_dim + 4)]`` (a block's e4m3 codes, then one
    float32 scale per key). Returns int32 ``[batch, seqlen_q, top_k]`` positions, or with ``slots``
    the cache slots ``block * block_size + offset`` that flash_mla_with_kvcache's ``indices`` take
    (-1 kept)."""
    ctx = _ctx(context)
    qf, _, _ = _query(q)
    if qf.ndim != 4 or 0 in qf.shape:
        _invalid("q must be [batch, seqlen_q, heads, index_head_dim], not %s" % list(qf.shape), _SHAPE)
    B, S, H, D = qf.shape
    w = np.ascontiguousarray(_numpy(weights, "weights"), dtype=np.float32)
    if w.shape != (B, S, H):
        _invalid("weights must be [batch %d, seqlen_q %d, heads %d], not %s" % (B, S, H, list(w.shape)), _SHAPE)
    if not isinstance(index_dtype, str) or index_dtype.lower() not in _DTYPES:
        _invalid("index_dtype must be one of %s, not %r" % (", ".join(_DTYPES), index_dtype))
    kd = _DTYPES[index_dtype.lower()]
    m = _Mem(index_cache, "index_cache")
    if not m.contiguous:
        _invalid("index_cache %s must be contiguous: clmla reads it in place" % list(m.shape))
    if kd == _FP8:
        if m.dtype not in _FP8_BYTES or len(m.shape) != 2 or m.shape[1] % (D + 4):
            _invalid("index_cache %s %s: an fp8 index cache is bytes [num_blocks, block_size * (%d + 4)]" % (
                m.dtype, list(m.shape), D), _SHAPE)
        nb, bs = m.shape[0], m.shape[1] // (D + 4)
    else:
        want = {_F32: ("float32",), _F16: ("float16",), _BF16: ("bfloat16", "uint16")}[kd]
        if m.dtype not in want or len(m.shape) != 3 or m.shape[2] != D:
            _invalid("index_cache %s %s: a %s index cache is [num_blocks, block_size, index_head_dim %d]" % (
                m.dtype, list(m.shape), index_dtype, D), _SHAPE)
        nb, bs = m.shape[0], m.shape[1]
    if nb < 1 or bs < 1:
        _invalid("index_cache %s is empty" % list(m.shape), _SHAPE)
    k = _int(top_k, "top_k", 1, _MAX_TOPK)
    bt, lens = _dense_tables(block_table, cache_seqlens, B, bs)
    # the attention layout does not matter to the selection: the smallest one that carries the keys
    p = _paged(ctx, 128, 2, bs, _F32, D, kd)
    al = p.alignment
    a = STRUCTS["clmla_paged_index_args"]()
    a.batch, a.seqlen_q, a.num_heads, a.top_k, a.causal = B, S, H, k, int(bool(causal))
    qa, wa = _aligned_copy(qf, al), _aligned_copy(w, al)
    bt, lens = _aligned_copy(bt, al), _aligned_copy(lens, al)
    out = _aligned((B, S, k), np.int32, al)
    _host_array(a.q, qa)
    _host_array(a.weights, wa)
    _host(a.index_cache, m.ptr, m.nbytes)
    a.num_blocks = nb
    _host_array(a.block_table, bt)
    a.max_blocks, a.max_seqlen = bt.shape[1], int(lens.max())
    _host_array(a.cache_seqlens, lens)
    _host_array(a.indices, out)
    _check(lib.clmla_paged_index_select(p._require(), ctypes.byref(a), None), ctx._handle)
    if not slots:
        return out
    valid = out >= 0
    rows = np.broadcast_to(np.arange(B)[:, None, None], out.shape)
    blocks = bt[rows, np.where(valid, out, 0) // bs]
    return np.where(valid, blocks * bs + out % bs, -1).astype(np.int32)


# ---- caches the library uses in place, layouts, status ------------------------------------------------------------

def _layout_args(block_size, kv_lora_rank, rope_dim, dtype):
    if not isinstance(dtype, str) or dtype.lower() not in _DTYPES:
        _invalid("dtype must be one of %s, not %r" % (", ".join(_DTYPES), dtype))
    return (_int(kv_lora_rank, "kv_lora_rank", 1, 1 << 20), _int(rope_dim, "rope_dim", 0, 1 << 20),
            _int(block_size, "block_size", 1, _INT32_MAX), _DTYPES[dtype.lower()])


def paged_info(kv_lora_rank: int = 512, rope_dim: int = 64, block_size: int = 64, dtype: str = "bf16", *,
               context=None) -> dict:
    """clmla_paged_info of a layout on a context: ``row_bytes``, ``block_bytes``,
    ``host_alignment`` (bytes: host memory at a multiple of it is used in place where
    ``host_unified`` is 1), and the counters ``host_wrapped``, ``host_copied``,
    ``host_copied_bytes`` of that layout's calls so far."""
    rkv, dr, bs, dt = _layout_args(block_size, kv_lora_rank, rope_dim, dtype)
    return _paged(_ctx(context), rkv, dr, bs, dt).info()


def empty_kv_cache(num_blocks: int, block_size: int, kv_lora_rank: int = 512, rope_dim: int = 64,
                   dtype: str = "bf16", heads_axis: bool = True, *, context=None) -> np.ndarray:
    """A zeroed cache ``[num_blocks, block_size, 1, row]`` (``[num_blocks, block_size, row]`` without
    ``heads_axis``) whose data starts at a multiple of the device's host_alignment, so that clmla
    uses it in place. ``dtype``: "f32" (float32), "f16" (float16), "bf16" (ml_dtypes.bfloat16 when
    ml_dtypes is installed, else the bits as uint16), "fp8" (uint8 rows of rkv + 4 rkv / 128 + 2 dr
    bytes: FlashMLA's and vLLM's fp8_ds_mla layout)."""
    nb = _int(num_blocks, "num_blocks", 1, _INT32_MAX)
    rkv, dr, bs, dt = _layout_args(block_size, kv_lora_rank, rope_dim, dtype)
    if dt == _FP8 and rkv % 128:
        _invalid("an fp8 cache needs kv_lora_rank a multiple of 128, not %d" % rkv, _SHAPE)
    p = _paged(_ctx(context), rkv, dr, bs, dt)
    if dt == _BF16:
        try:
            import ml_dtypes
            np_dtype = np.dtype(ml_dtypes.bfloat16)
        except ImportError:
            np_dtype = np.dtype(np.uint16)
    else:
        np_dtype = np.dtype({_F32: np.float32, _F16: np.float16, _FP8: np.uint8}[dt])
    row = _row_size(dt, rkv, dr)
    shape = (nb, bs, 1, row) if heads_axis else (nb, bs, row)
    n = nb * bs * row * np_dtype.itemsize
    raw = np.zeros(n + p.alignment, np.uint8)
    start = (-raw.ctypes.data) % p.alignment
    return raw[start: start + n].view(np_dtype).reshape(shape)


def paged_status(context=None, reset: bool = True) -> set:
    """The problems the device found in block tables, lengths and slots it held in device buffers
    (clmla_paged_status over every layout used on the context): a set of "bad_block",
    "bad_length", "bad_slot"; cleared with ``reset``. The functions of this module pass their
    tables in host memory, which is checked before each call instead."""
    ctx = _ctx(context)
    with _layouts_lock:
        layouts = [p for p in _layouts.get(ctx, {}).values() if not p.closed]
    flags = 0
    for p in layouts:
        f = ctypes.c_uint32(0)
        _check(lib.clmla_paged_status(p._require(), int(bool(reset)), ctypes.byref(f)), ctx._handle)
        flags |= f.value
    return {name for name, bit in _BAD_FLAGS.items() if flags & bit}
