"""clmla: DeepSeek's Multi-head Latent Attention on any OpenCL device, from Python.

    import clmla
    layer = clmla.Layer.from_pretrained("DeepSeek-V2-Lite", layer=3)
    cache = clmla.Cache(layer.context, blocks=64, config=layer)
    seq = cache.add()
    out = layer(x, batch=[(seq, len(x))], cache=cache)   # x [T, hidden_size] -> out [T, hidden_size]

Every failure raises clmla.Error (.status, .message). See python/README.md.
"""

from ._binding import CONST, library_path
from ._core import (CACHE_DTYPES, HEADER_VERSION, PATHS, WEIGHTS_DTYPES, Cache, CacheInfo, Context, Device, Error,
                    Layer, LayerConfig, Linear, Model, ModelAttention, Sequence, Weight, default_context, devices,
                    index_select, latent_attention, model_types, presets, resolve_device, version)
from . import _binding as binding
from . import engine
from .engine import (concat_and_cache_mla, empty_kv_cache, flash_mla_with_kvcache, get_mla_metadata, indexer_select,
                     paged_info, paged_status)

__version__ = HEADER_VERSION
WARMUP_TOKENS = CONST["CLMLA_WARMUP_TOKENS"]

__all__ = ["Cache", "CacheInfo", "Context", "Device", "Error", "Layer", "LayerConfig", "Linear", "Model", "ModelAttention",
           "Sequence", "Weight",
           "default_context", "devices", "index_select", "latent_attention", "model_types", "presets", "resolve_device", "version",
           "flash_mla_with_kvcache", "get_mla_metadata", "concat_and_cache_mla", "indexer_select", "empty_kv_cache",
           "paged_info", "paged_status", "engine", "binding", "library_path", "WARMUP_TOKENS", "CACHE_DTYPES", "WEIGHTS_DTYPES", "PATHS", "__version__"]
