"""clmla's engine calls and layer step as PyTorch custom operators (namespace ``clmla``), so that
a model calling them can be traced by ``torch.compile`` without graph breaks inside them:

    import clmla.torch_ops
    out, lse = torch.ops.clmla.flash_mla_with_kvcache(q, kv_cache, block_table, cache_seqlens, 512)

Each operator runs the plain clmla function on CPU tensors (``device_types="cpu"``) and has a fake
(meta) implementation that gives the output shapes and dtypes without running anything. This
module imports torch; ``import clmla`` does not import it. See python/README.md, "torch custom ops".

Layers and caches are Python objects, not tensors: ``layer_forward`` takes the integer ids that
``register_layer`` and ``register_cache`` hand out, and the C ids of the cache's sequences."""

from __future__ import annotations

import itertools
import threading
from typing import List, Optional, Tuple

import torch

from . import engine
from ._core import Cache, Layer, _invalid

__all__ = ["flash_mla_with_kvcache", "concat_and_cache_mla", "indexer_select", "layer_forward", "register_layer",
           "register_cache", "unregister", "registered"]


# ---- layers and caches by id ---------------------------------------------------------------------------------------

_objects: dict = {}
_ids = itertools.count(1)
_lock = threading.Lock()


def _register(obj) -> int:
    with _lock:
        for i, o in _objects.items():
            if o is obj:
                return i
        i = next(_ids)
        _objects[i] = obj
        return i


def register_layer(layer: Layer) -> int:
    """The id ``layer_forward`` takes for ``layer`` (the same id for the same object). The registry
    holds the layer until ``unregister``."""
    if not isinstance(layer, Layer):
        _invalid("register_layer takes a clmla.Layer, not %r" % type(layer).__name__)
    return _register(layer)


def register_cache(cache: Cache) -> int:
    """The id ``layer_forward`` takes for ``cache`` (the same id for the same object). The registry
    holds the cache until ``unregister``."""
    if not isinstance(cache, Cache):
        _invalid("register_cache takes a clmla.Cache, not %r" % type(cache).__name__)
    return _register(cache)


def unregister(obj_id: int) -> None:
    """Forgets a layer or cache id (closing nothing); an unknown id is an error."""
    with _lock:
        if _objects.pop(obj_id, None) is None:
            _invalid("no clmla layer or cache is registered under id %r" % (obj_id,))


def registered(obj_id: int):
    """The layer or cache registered under ``obj_id``."""
    with _lock:
        obj = _objects.get(obj_id)
    if obj is None:
        _invalid("no clmla layer or cache is registered under id %r" % (obj_id,))
    return obj


def _layer(layer_id: int) -> Layer:
    obj = registered(layer_id)
    if not isinstance(obj, Layer):
        _invalid("id %d is a %s, not a clmla.Layer" % (layer_id, type(obj).__name__))
    return obj


def _cache(cache_id: int) -> Cache:
    obj = registered(cache_id)
    if not isinstance(obj, Cache):
        _invalid("id %d is a %s, not a clmla.Cache" % (cache_id, type(obj).__name__))
    return obj


# ---- implementations (plain functions on CPU tensors) --------------------------------------------------------------

def flash_mla_impl(q, k_cache, block_table, cache_seqlens, head_dim_v, softmax_scale=None, causal=False,
                   is_fp8_kvcache=False, indices=None):
    """clmla.engine.flash_mla_with_kvcache on torch tensors: (out in q's dtype, lse float32)."""
    out, lse = engine.flash_mla_with_kvcache(q, k_cache, block_table, cache_seqlens, head_dim_v, None,
                                             softmax_scale=softmax_scale, causal=causal,
                                             is_fp8_kvcache=is_fp8_kvcache, indices=indices)
    return out, lse


def concat_and_cache_impl(kv_c, k_pe, kv_cache, slot_mapping, kv_cache_dtype) -> None:
    """clmla.engine.concat_and_cache_mla: writes kv_cache in place."""
    engine.concat_and_cache_mla(kv_c, k_pe, kv_cache, slot_mapping, kv_cache_dtype)


def indexer_select_impl(q, weights, index_cache, block_table, cache_seqlens, top_k, causal=False,
                        index_dtype="f32", slots=False):
    """clmla.engine.indexer_select as an int32 tensor [batch, seqlen_q, top_k]."""
    return torch.from_numpy(engine.indexer_select(q, weights, index_cache, block_table, cache_seqlens, top_k,
                                                  causal=causal, index_dtype=index_dtype, slots=slots))


def _batch(cache: Cache, seq_ids, num_tokens) -> list:
    """[(Sequence, n)] from the C ids of live sequences of ``cache`` and their token counts."""
    if len(seq_ids) != len(num_tokens):
        _invalid("seq_ids (%d) and num_tokens (%d) must have one entry per batch entry" % (
            len(seq_ids), len(num_tokens)))
    batch = []
    for sid, n in zip(seq_ids, num_tokens):
        seq = cache._seqs.get(int(sid))
        if seq is None or seq.freed:
            _invalid("the cache has no live sequence %d" % int(sid), "CLMLA_ERROR_UNKNOWN_SEQUENCE")
        batch.append((seq, int(n)))
    return batch


def layer_forward_impl(x, layer_id, cache_id, seq_ids, num_tokens, cache_layer=0):
    """One step of a registered layer over a registered cache: ``x [T, hidden_size]``, batch entry i
    the ``num_tokens[i]`` new tokens of sequence ``seq_ids[i]`` (Sequence.id). Appends them to the
    cache's ``cache_layer`` and returns the output [T, hidden_size] in x's dtype (computed in float32)."""
    layer, cache = _layer(layer_id), _cache(cache_id)
    out = layer(x, batch=_batch(cache, seq_ids, num_tokens), cache=cache, cache_layer=cache_layer)
    y = torch.from_numpy(out)
    return y if x.dtype == torch.float32 else y.to(x.dtype)


# ---- the operators -------------------------------------------------------------------------------------------------

@torch.library.custom_op("clmla::flash_mla_with_kvcache", mutates_args=(), device_types="cpu", schema=(
    "(Tensor q, Tensor k_cache, Tensor? block_table, Tensor? cache_seqlens, int head_dim_v, float? softmax_scale=None, "
    "bool causal=False, bool is_fp8_kvcache=False, Tensor? indices=None) -> (Tensor, Tensor)"))
def flash_mla_with_kvcache(q: torch.Tensor, k_cache: torch.Tensor, block_table: Optional[torch.Tensor],
                           cache_seqlens: Optional[torch.Tensor], head_dim_v: int,
                           softmax_scale: Optional[float] = None, causal: bool = False, is_fp8_kvcache: bool = False,
                           indices: Optional[torch.Tensor] = None) -> Tuple[torch.Tensor, torch.Tensor]:
    """FlashMLA's attention over a paged latent cache (clmla.engine.flash_mla_with_kvcache without
    the ignored scheduler arguments): out [batch, seqlen_q, heads_q, head_dim_v] in q's dtype and
    lse [batch, heads_q, seqlen_q] float32."""
    return flash_mla_impl(q, k_cache, block_table, cache_seqlens, head_dim_v, softmax_scale, causal,
                          is_fp8_kvcache, indices)


@flash_mla_with_kvcache.register_fake
def _(q, k_cache, block_table, cache_seqlens, head_dim_v, softmax_scale=None, causal=False, is_fp8_kvcache=False,
      indices=None):
    torch._check(q.dim() == 4, lambda: "q must be [batch, seqlen_q, heads_q, head_dim], not %s" % list(q.shape))
    B, S, H, _ = q.shape
    return q.new_empty((B, S, H, head_dim_v)), q.new_empty((B, H, S), dtype=torch.float32)


@torch.library.custom_op("clmla::concat_and_cache_mla", mutates_args=("kv_cache",), device_types="cpu", schema=(
    "(Tensor kv_c, Tensor k_pe, Tensor(a!) kv_cache, Tensor slot_mapping, str kv_cache_dtype) -> ()"))
def concat_and_cache_mla(kv_c: torch.Tensor, k_pe: torch.Tensor, kv_cache: torch.Tensor, slot_mapping: torch.Tensor,
                         kv_cache_dtype: str) -> None:
    """vLLM's concat_and_cache_mla: token t's kv_c[t] and k_pe[t] into row slot_mapping[t] of
    kv_cache, in place (clmla.engine.concat_and_cache_mla)."""
    concat_and_cache_impl(kv_c, k_pe, kv_cache, slot_mapping, kv_cache_dtype)


@concat_and_cache_mla.register_fake
def _(kv_c, k_pe, kv_cache, slot_mapping, kv_cache_dtype):
    return None


@torch.library.custom_op("clmla::indexer_select", mutates_args=(), device_types="cpu", schema=(
    "(Tensor q, Tensor weights, Tensor index_cache, Tensor block_table, Tensor cache_seqlens, int top_k, "
    "bool causal=False, str index_dtype=\"f32\", bool slots=False) -> Tensor"))
def indexer_select(q: torch.Tensor, weights: torch.Tensor, index_cache: torch.Tensor, block_table: torch.Tensor,
                   cache_seqlens: torch.Tensor, top_k: int, causal: bool = False, index_dtype: str = "f32",
                   slots: bool = False) -> torch.Tensor:
    """DeepSeek Sparse Attention's top-k selection (clmla.engine.indexer_select): int32
    [batch, seqlen_q, top_k] positions, or cache slots with ``slots``; -1 past the visible keys."""
    return indexer_select_impl(q, weights, index_cache, block_table, cache_seqlens, top_k, causal, index_dtype, slots)


@indexer_select.register_fake
def _(q, weights, index_cache, block_table, cache_seqlens, top_k, causal=False, index_dtype="f32", slots=False):
    torch._check(q.dim() == 4, lambda: "q must be [batch, seqlen_q, heads, index_head_dim], not %s" % list(q.shape))
    B, S = q.shape[0], q.shape[1]
    return q.new_empty((B, S, top_k), dtype=torch.int32)


@torch.library.custom_op("clmla::layer_forward", mutates_args=(), device_types="cpu", schema=(
    "(Tensor x, int layer_id, int cache_id, SymInt[] seq_ids, SymInt[] num_tokens, int cache_layer=0) -> Tensor"))
def layer_forward(x: torch.Tensor, layer_id: int, cache_id: int, seq_ids: List[int], num_tokens: List[int],
                  cache_layer: int = 0) -> torch.Tensor:
    """One step of a registered clmla.Layer over a registered clmla.Cache (layer_forward_impl).
    Appends the step's tokens to the cache: a side effect on clmla's device memory, which is not a
    tensor argument; the operator is registered with an ordered effect for that reason."""
    return layer_forward_impl(x, layer_id, cache_id, seq_ids, num_tokens, cache_layer)


@layer_forward.register_fake
def _(x, layer_id, cache_id, seq_ids, num_tokens, cache_layer=0):
    torch._check(len(seq_ids) == len(num_tokens),
                 lambda: "seq_ids and num_tokens must have one entry per batch entry")
    return x.new_empty((x.shape[0], _layer(layer_id).config.hidden_size))


# The step appends to the clmla cache, which no tensor argument shows: an ordered effect makes
# torch.compile thread a token through each call, so that a call whose output is unused is kept
# and calls stay in program order among the ordered-effect calls.
try:
    layer_forward.register_effect(torch.library.EffectType.ORDERED)
except AttributeError:  # torch whose CustomOpDef has no register_effect
    from torch._higher_order_ops.effects import _EffectType, _register_effectful_op
    _register_effectful_op(torch.ops.clmla.layer_forward.default, _EffectType.ORDERED)
