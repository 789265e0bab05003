"""transformers models whose MLA attention computes through clmla.

    import clmla.hf
    model = clmla.hf.attach(model)            # each MLA attention module now runs on clmla
    tokens = model.generate(**inputs, max_new_tokens=48)
    clmla.hf.detach(model)                    # back to transformers' own attention

``attach`` reads the model's config through clmla's own config.json reader (so a family or field
clmla does not run is refused by name, as ``clmla run`` refuses it), uploads each attention
module's weights once (``clmla.Layer``), and replaces each module's ``forward``. The latent cache
lives in clmla: one ``clmla.Model`` of those layers, with its cache, per generate call (made when a
forward starts from an empty transformers cache), which also carries glm_moe_dsa's selections from
full to "shared" layers; transformers' own cache only keeps count of the tokens (one value per token
and layer), so that generate's positions and masks stay as they are. Each sequence's real
tokens (left padding removed, from the attention mask given to the model) go to clmla, at
positions 0, 1, ... as transformers numbers them; padding positions get zeros. The rest of the
model stays in torch. CPU tensors only; torch is imported when ``attach`` is called.
"""

from __future__ import annotations

import dataclasses
import tempfile
from typing import Optional

import numpy as np

from ._core import Cache, Context, Layer, LayerConfig, Model, _ctx, _invalid

__all__ = ["attach", "detach", "attention_modules", "random_model"]

_CACHE_DTYPES = ("f32", "f16", "bf16", "fp8")
# transformers' MLA attention modules all hold these projections
_MLA_PARTS = ("kv_a_proj_with_mqa", "kv_b_proj", "o_proj")


def attention_modules(model) -> list:
    """The MLA attention modules of a transformers model, in the order the model runs them:
    [(name, module)]. A module counts when it holds kv_a_proj_with_mqa, kv_b_proj and o_proj."""
    found = []
    for name, m in model.named_modules():
        if all(hasattr(m, p) for p in _MLA_PARTS) and hasattr(m, "layer_idx"):
            found.append((name, m))
    return found


def _text_config(model):
    cfg = model.config
    return getattr(cfg, "text_config", None) or cfg


def _layer_config(model) -> LayerConfig:
    """The layer configuration clmla reads from the model's config.json, as saved by transformers
    (clmla_model_read_config: the family's rules, refusals by name)."""
    with tempfile.TemporaryDirectory(prefix="clmla-hf-") as tmp:
        model.config.save_pretrained(tmp)
        return LayerConfig.from_pretrained(tmp)


class _Attached:
    """What attach keeps on a model: the layers, the cache of the generate call in flight, and the
    attention mask and shape of the model's current forward."""

    def __init__(self, modules, layers, context: Context, cache_dtype: str, max_tokens: int):
        self.modules = modules
        self.layers = layers
        self.context = context
        self.cache_dtype = cache_dtype
        self.max_tokens = max_tokens
        self.model: Optional[Model] = None  # the layers over the generate call's cache
        self.cache: Optional[Cache] = None
        self.seqs: list = []
        self.mask = None          # the 2-D attention mask the model was called with (numpy bool) or None
        self.hooks = []

    def reset(self, batch: int, tokens: int):
        """A new generate call (or a forward without a cache): fresh sequences in a fresh cache of
        room for max(tokens, max_tokens) tokens per sequence in every attention layer."""
        if self.model is not None:
            self.model.close()
        room = max(tokens, self.max_tokens)
        blocks = batch * -(-room // 64)
        self.model = Model.from_layers(self.layers, blocks=blocks, block_tokens=64, cache_dtype=self.cache_dtype)
        self.cache = self.model.cache
        self.seqs = [self.cache.add() for _ in range(batch)]

    def real_tokens(self, batch: int, tokens: int) -> np.ndarray:
        """[batch, tokens] bool: which of the forward's tokens are real (not padding)."""
        if self.mask is None or self.mask.shape[0] != batch or self.mask.shape[1] < tokens:
            return np.ones((batch, tokens), bool)
        return self.mask[:, -tokens:]


def _model_pre_hook(state: _Attached):
    def hook(module, args, kwargs):
        mask = kwargs.get("attention_mask")
        if mask is None and len(args) > 1:
            mask = args[1]
        if mask is not None and getattr(mask, "dim", lambda: 0)() == 2:
            state.mask = mask.detach().cpu().numpy() != 0
        else:
            state.mask = None
    return hook


def _forward_for(state: _Attached, index: int, module):
    import torch

    def forward(hidden_states, *args, **kwargs):
        cache = kwargs.get("cache", kwargs.get("past_key_values"))
        B, T, D = hidden_states.shape
        if index == 0:
            past = cache.get_seq_length(module.layer_idx) if cache is not None else 0
            if cache is None or past == 0 or state.cache is None or len(state.seqs) != B:
                state.reset(B, past + T)
        real = state.real_tokens(B, T)
        x = hidden_states.detach().to(torch.float32).cpu().numpy()
        rows = [x[b, real[b]] for b in range(B)]
        entries = [(state.seqs[b], int(real[b].sum())) for b in range(B) if real[b].any()]
        out = np.zeros((B, T, D), np.float32)
        if entries:
            y = state.model.forward(index, np.concatenate([r for r in rows if len(r)]), entries)
            at = 0
            for b in range(B):
                n = int(real[b].sum())
                out[b, real[b]] = y[at: at + n]
                at += n
        if cache is not None:
            # transformers' cache counts the tokens (one value each: a cache layer holding no values
            # reads as empty); clmla holds them
            mark = hidden_states.new_zeros((B, 1, T, 1))
            cache.update(mark, mark, module.layer_idx, kwargs=kwargs)
        result = torch.from_numpy(out).to(hidden_states.dtype)
        # glm_moe_dsa's modules also return their selection, for a following "shared" layer (clmla's
        # shared layers take it from clmla's cache instead)
        return (result, None, None) if hasattr(module, "skip_topk") else (result, None)

    return forward


def attach(model, *, context: Optional[Context] = None, cache_dtype: str = "f32", weights_dtype: str = "auto",
           max_tokens: int = 4096):
    """Makes each MLA attention module of ``model`` (a transformers model on the CPU) compute
    through clmla; returns the model. ``cache_dtype``: the latent cache's ("f32", "f16", "bf16",
    "fp8"). ``weights_dtype``: "auto" (the module's own dtype), "f32", "f16", "bf16", "fp8".
    ``max_tokens``: tokens per sequence the cache of a generate call has room for (more when the
    prompt is longer). A model of a family or config clmla does not run, or without MLA attention,
    is refused with clmla.Error naming what."""
    import torch  # noqa: F401  (the model is a torch module)

    if getattr(model, "_clmla_attached", None) is not None:
        _invalid("the model is attached already: detach it first")
    if cache_dtype not in _CACHE_DTYPES:
        _invalid("cache_dtype must be one of %s, not %r" % (", ".join(_CACHE_DTYPES), cache_dtype))
    if not isinstance(max_tokens, int) or max_tokens < 1:
        _invalid("max_tokens must be a positive int, not %r" % (max_tokens,))
    impl = getattr(_text_config(model), "_attn_implementation", None)
    if impl not in (None, "eager", "sdpa"):
        _invalid("attn_implementation %r: attach replaces eager or sdpa attention (load the model with "
                 "attn_implementation=\"eager\" or \"sdpa\")" % impl)
    modules = attention_modules(model)
    if not modules:
        _invalid("the model (%s) has no MLA attention module (kv_a_proj_with_mqa, kv_b_proj, o_proj)" %
                 type(model).__name__)
    for name, m in modules:
        for p in m.parameters():
            if p.device.type != "cpu":
                _invalid("%s is on %s: clmla.hf takes models on the CPU" % (name, p.device))
    config = _layer_config(model)
    # glm_moe_dsa's "shared" layers (skip_topk) have no indexer: they attend to the selection the full
    # layer before them made in the same step, which clmla keeps with the cache
    shared = dataclasses.replace(config, index_n_heads=0, index_shared=1)
    ctx = _ctx(context)
    layers = []
    for name, m in modules:
        try:
            layers.append(Layer(shared if getattr(m, "skip_topk", False) else config, m.state_dict(), context=ctx,
                                weights_dtype=None if weights_dtype == "auto" else weights_dtype))
        except Exception as e:
            for layer in layers:
                layer.close()
            if hasattr(e, "message"):
                e.message = "%s: %s" % (name, e.message)
            raise
    state = _Attached(modules, layers, ctx, cache_dtype, max_tokens)
    for i, (_, m) in enumerate(modules):
        m._clmla_forward = m.forward
        m.forward = _forward_for(state, i, m)
    state.hooks.append(model.register_forward_pre_hook(_model_pre_hook(state), with_kwargs=True))
    model._clmla_attached = state
    return model


def detach(model):
    """Undoes attach: transformers' own attention again, clmla's layers and cache closed. Returns
    the model."""
    state = getattr(model, "_clmla_attached", None)
    if state is None:
        _invalid("the model is not attached")
    for _, m in state.modules:
        m.forward = m._clmla_forward
        del m._clmla_forward
    for h in state.hooks:
        h.remove()
    if state.model is not None:
        state.model.close()
    for layer in state.layers:
        layer.close()
    model._clmla_attached = None
    return model



def random_model(config, *, seed: int = 0, std: Optional[float] = None, norm_std: float = 0.2):
    """A transformers causal LM of ``config`` (eager attention, eval mode) with random weights,
    for trying clmla without a checkpoint: each norm's weight is 1 + norm_std * N(0, 1), every other
    parameter std * N(0, 1) (std None: 1 / sqrt of the parameter's last dimension), drawn after
    ``torch.manual_seed(seed)``. Returns the model."""
    import torch
    import transformers

    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager").eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            scale = std if std is not None else p.shape[-1] ** -0.5
            p.copy_(1.0 + norm_std * torch.randn_like(p) if "norm" in name else scale * torch.randn_like(p))
    return model
