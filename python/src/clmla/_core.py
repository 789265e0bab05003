"""The Python API of clmla over the ctypes binding (_binding.py). See python/README.md."""

from __future__ import annotations

import ctypes
import dataclasses
import math
import os
import sys
import threading
import weakref
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping, Optional, Sequence as Seq, Tuple, Union

import numpy as np

from . import _cl
from ._binding import CONST, LOG_FN, STRUCTS, ctype_of, lib

_C = STRUCTS
_P = ctypes.POINTER


# ---- errors ----------------------------------------------------------------------------------------

class Error(Exception):
    """Every failure of clmla: ``.status`` is the status name (``"CLMLA_ERROR_CACHE_FULL"``,
    ``"CL_OUT_OF_RESOURCES"``), ``.code`` its number, ``.message`` the library's message
    (clmla_last_error) or, for arguments refused in Python before any C call, the reason."""

    def __init__(self, code: int, message: str):
        self.code = int(code)
        self.status = _status_name(self.code)
        self.message = message
        super().__init__("%s: %s" % (self.status, message) if message else self.status)


def _status_name(code: int) -> str:
    s = lib.clmla_status_string(int(code))
    return s.decode("utf-8", "replace") if s else "unknown status %d" % code


def _last_error(ctx_handle) -> str:
    m = lib.clmla_last_error(ctx_handle)
    return m.decode("utf-8", "replace") if m else ""


def _check(status: int, ctx_handle=None) -> None:
    if status != 0:
        raise Error(status, _last_error(ctx_handle))


def _invalid(message: str, code: str = "CLMLA_ERROR_INVALID_ARGUMENT"):
    raise Error(CONST[code], message)


def _int(value, what: str, lo: Optional[int] = None, hi: Optional[int] = None) -> int:
    """value as a Python int (no bools, floats or strings), within [lo, hi]."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        _invalid("%s must be an integer, not %r" % (what, type(value).__name__))
    v = int(value)
    if lo is not None and v < lo:
        _invalid("%s must be at least %d, not %d" % (what, lo, v))
    if hi is not None and v > hi:
        _invalid("%s must be at most %d, not %d" % (what, hi, v))
    return v


def _choice(value, what: str, names: Mapping[str, int]) -> int:
    if isinstance(value, str) and value.lower() in names:
        return names[value.lower()]
    _invalid("%s must be one of %s, not %r" % (what, ", ".join(sorted(names)), value))


def _text(b) -> str:
    return b.decode("utf-8", "replace") if isinstance(b, bytes) else str(b)


def version() -> str:
    """The version of the libclmla actually loaded ("MAJOR.MINOR.PATCH")."""
    return _text(lib.clmla_version_string())


HEADER_VERSION = "%d.%d.%d" % (CONST["CLMLA_VERSION_MAJOR"], CONST["CLMLA_VERSION_MINOR"],
                               CONST["CLMLA_VERSION_PATCH"])

# ---- names of enums ----------------------------------------------------------------------------------

CACHE_DTYPES = {"f32": 0, "f16": 1, "bf16": 2, "fp8": 3}
WEIGHTS_DTYPES = {"auto": 0, "as_given": 0, "f32": 1, "f16": 2, "bf16": 3, "fp8": 4}
PATHS = {"auto": 0, "absorbed": 1, "decompressed": 2}
ROPE_PAIRINGS = {"interleaved": 0, "half_split": 1, "half-split": 1}
ROPE_TYPES = {"auto": 0, "default": 1, "linear": 2, "yarn": 3, "longrope": 4, "llama3": 5, "none": 6}
LOG_LEVELS = {"off": 0, "warning": 1, "info": 2}
_DTYPE_NAMES = {0: "f32", 1: "f16", 2: "bf16", 3: "fp8"}


def _name_of(names: Mapping[str, int], value: int) -> Union[str, int]:
    for k, v in names.items():
        if v == value:
            return k
    return value


# ---- devices -------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Device:
    """One OpenCL device, as ``clmla devices`` lists it."""
    index: int
    platform_index: int
    device_index: int
    kind: str
    platform_name: str
    vendor: str
    name: str
    device_version: str
    driver_version: str
    global_mem_bytes: int
    max_alloc_bytes: int
    local_mem_bytes: int
    compute_units: int
    max_work_group_size: int
    fp16: bool
    fp64: bool
    is_default: bool

    @property
    def spec(self) -> str:
        """The "P:D" spec that names this device."""
        return "%d:%d" % (self.platform_index, self.device_index)


def _device(info) -> Device:
    kind = _text(lib.clmla_device_kind_name(info.kind))
    return Device(info.index, info.platform_index, info.device_index, kind, _text(info.platform_name),
                  _text(info.vendor), _text(info.name), _text(info.device_version), _text(info.driver_version),
                  int(info.global_mem_bytes), int(info.max_alloc_bytes), int(info.local_mem_bytes),
                  int(info.compute_units), int(info.max_work_group_size), bool(info.fp16), bool(info.fp64),
                  bool(info.is_default))


def devices() -> list:
    """Every OpenCL device on every platform, in the order of ``clmla devices``
    (``Error`` CLMLA_ERROR_NO_PLATFORM when no OpenCL platform is installed)."""
    arr = _P(_C["clmla_device_info"])()
    count = ctypes.c_size_t(0)
    _check(lib.clmla_devices_list(ctypes.byref(arr), ctypes.byref(count)))
    try:
        return [_device(arr[i]) for i in range(count.value)]
    finally:
        lib.clmla_free(ctypes.cast(arr, ctypes.c_void_p))


def resolve_device(spec: Optional[str] = None) -> int:
    """The index in devices() that a device spec picks (None: CLMLA_DEVICE, else the first GPU,
    else the first device)."""
    idx = ctypes.c_size_t(0)
    _check(lib.clmla_device_resolve(_spec_bytes(spec), ctypes.byref(idx)))
    return idx.value


def _spec_bytes(spec) -> Optional[bytes]:
    if spec is None:
        return None
    if isinstance(spec, Device):
        return spec.spec.encode()
    if isinstance(spec, (int, np.integer)) and not isinstance(spec, bool):
        return str(int(spec)).encode()
    if isinstance(spec, str):
        if "\0" in spec:
            _invalid("a device spec cannot hold a NUL character")
        return spec.encode()
    _invalid("device must be None, a spec string, an index or a Device, not %r" % type(spec).__name__)


# ---- context ----------------------------------------------------------------------------------------------

class _Owned:
    """An object holding one C handle, destroyed by close() or when collected."""
    _handle = None
    _destroy = None

    def _require(self):
        if not self._handle:
            _invalid("%s is closed" % type(self).__name__)
        return self._handle

    def close(self) -> None:
        """Destroys the C object now (later calls on it raise clmla.Error); idempotent."""
        h, self._handle = self._handle, None
        if h and self._destroy is not None:
            type(self)._destroy(h)

    @property
    def closed(self) -> bool:
        return not self._handle

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:  # interpreter shutdown
            pass


class Context(_Owned):
    """One OpenCL device with its own context and in-order queue.

    ``device``: None (CLMLA_DEVICE, else the first GPU, else the first device), a spec such as
    ``"gpu"``, ``"cpu"``, ``"0:1"``, ``"pthread"``, a flat index or a :class:`Device`.
    ``clblast_tuning``: None, ``"auto"``, ``"off"`` or a file (README: CLBlast tuning).
    ``attention_kernels``: None (CLMLA_ATTENTION_KERNELS, else ``"auto"``), ``"auto"``, ``"rows"``
    or ``"group"``: the attention kernels for CPUs or for GPUs, on any device.
    ``product_kernels``: the same for the matrix products (CLMLA_PRODUCT_KERNELS): the CPU forms
    (packed weights) or the GPU forms, on any device.
    ``trace``: None (CLMLA_TRACE, else none), ``""`` (none) or a file to append a record of every
    command on the queue to, with device timestamps (``tools/trace_summary.py`` sums it up).
    ``program_binaries``: None (CLMLA_PROGRAM_BINARIES, else ``"auto"``), ``"auto"``, ``"on"`` or
    ``"off"``: whether compiled programs are kept in ``cache_dir``; auto keeps them on every device
    but PoCL's CPU device, which has a kernel cache of its own.
    ``log``: ``callable(level: str, message: str)``, called up to ``log_level``
    (``"off"``, ``"warning"``, ``"info"``).

    Layers, caches and linears made on a context keep it alive; ``close()`` closes them first."""

    _destroy = staticmethod(lambda h: lib.clmla_context_destroy(h))

    def __init__(self, device=None, *, kernel_dir: Optional[str] = None, cache_dir: Optional[str] = None,
                 clblast_tuning: Optional[str] = None, log: Optional[Callable[[str, str], Any]] = None,
                 log_level: str = "off", attention_kernels: Optional[str] = None, trace: Optional[str] = None,
                 product_kernels: Optional[str] = None, program_binaries: Optional[str] = None):
        self._children = weakref.WeakSet()
        self._lock = threading.Lock()
        opts = _C["clmla_context_options"]()
        keep = []
        opts.device = _spec_bytes(device)
        for fname, value in (("kernel_dir", kernel_dir), ("cache_dir", cache_dir), ("clblast_tuning", clblast_tuning),
                             ("attention_kernels", attention_kernels), ("trace", trace),
                             ("product_kernels", product_kernels), ("program_binaries", program_binaries)):
            if value is not None:
                if not isinstance(value, (str, os.PathLike)):
                    _invalid("%s must be a string, not %r" % (fname, type(value).__name__))
                b = os.fsencode(value)
                keep.append(b)
                setattr(opts, fname, b)
        level = _choice(log_level, "log_level", LOG_LEVELS)
        self._log_cb = None
        if log is not None:
            if not callable(log):
                _invalid("log must be callable(level, message)")
            names = {1: "warning", 2: "info"}

            def _cb(user, lvl, message, _log=log):
                try:
                    _log(names.get(lvl, str(lvl)), _text(message))
                except Exception:  # never let a Python exception cross the C frames
                    pass

            self._log_cb = LOG_FN(_cb)
            opts.log = self._log_cb
            opts.log_level = level or 1
        handle = ctypes.c_void_p()
        _check(lib.clmla_context_create_opts(ctypes.byref(opts), ctypes.byref(handle)))
        self._handle = handle.value

    def _adopt(self, child):
        self._children.add(child)

    def close(self) -> None:
        """Closes every layer, cache and linear made on this context, then the context."""
        for child in list(self._children):
            child.close()
        super().close()

    @property
    def device(self) -> Device:
        """The device behind the context."""
        info = _C["clmla_device_info"]()
        h = self._require()
        _check(lib.clmla_context_device(h, ctypes.byref(info)), h)
        return _device(info)

    @property
    def cl_context(self) -> int:
        """The cl_context handle (an integer), for engines that make their own buffers."""
        return lib.clmla_context_cl_context(self._require()) or 0

    @property
    def queue(self) -> int:
        """The cl_command_queue handle (an integer)."""
        return lib.clmla_context_queue(self._require()) or 0

    def program_stats(self) -> dict:
        """Counters of the kernel program cache."""
        s = _C["clmla_program_stats"]()
        h = self._require()
        _check(lib.clmla_context_program_stats(h, ctypes.byref(s)), h)
        return {f: int(getattr(s, f)) for f, _ in s._fields_}

    def last_error(self) -> str:
        return _last_error(self._require())

    def __repr__(self):
        if not self._handle:
            return "<clmla.Context (closed)>"
        d = self.device
        return "<clmla.Context %s: %s (%s)>" % (d.spec, d.name, d.platform_name)


_default_context: Optional[Context] = None
_default_lock = threading.Lock()


def default_context() -> Context:
    """The context used where none is given: made once, on the default device."""
    global _default_context
    with _default_lock:
        if _default_context is None or _default_context.closed:
            _default_context = Context()
        return _default_context


def _ctx(context) -> Context:
    if context is None:
        return default_context()
    if not isinstance(context, Context):
        _invalid("context must be a clmla.Context, not %r" % type(context).__name__)
    context._require()
    return context


# ---- layer configuration ----------------------------------------------------------------------------------

@dataclass
class LayerConfig:
    """clmla_layer_config: the shape and RoPE of one MLA layer (docs/MLA.md). Every field has the C
    meaning; 0 means "default" as in C. Enums are names: ``rope_pairing`` "interleaved" or
    "half_split", ``rope_type`` "auto", "default", "linear", "yarn", "longrope", "llama3", "none",
    ``weights_dtype`` "auto" (as given), "f32", "f16", "bf16", "fp8"."""
    hidden_size: int = 0
    num_heads: int = 0
    q_lora_rank: int = 0
    kv_lora_rank: int = 0
    qk_nope_head_dim: int = 0
    qk_rope_head_dim: int = 0
    v_head_dim: int = 0
    rms_norm_eps: float = 0.0
    rope_theta: float = 0.0
    rope_pairing: str = "interleaved"
    yarn_factor: float = 0.0
    yarn_original_max_position: int = 0
    yarn_beta_fast: float = 0.0
    yarn_beta_slow: float = 0.0
    yarn_mscale: float = 0.0
    yarn_mscale_all_dim: float = 0.0
    rope_type: str = "auto"
    rope_attention_factor: float = 0.0
    yarn_no_truncate: int = 0
    llama3_low_freq_factor: float = 0.0
    llama3_high_freq_factor: float = 0.0
    longrope_short_factor: Tuple[float, ...] = ()
    longrope_long_factor: Tuple[float, ...] = ()
    query_scale_beta: float = 0.0
    query_scale_interval: int = 0
    q_latent_scale: float = 0.0
    kv_latent_scale: float = 0.0
    dense_max_keys: int = 0
    weights_dtype: str = "auto"
    tp_rank: int = 0
    tp_size: int = 0
    index_n_heads: int = 0
    index_head_dim: int = 0
    index_topk: int = 0
    index_rope_pairing: str = "interleaved"
    index_norm_eps: float = 0.0
    index_shared: int = 0

    _ENUMS = {"rope_pairing": ROPE_PAIRINGS, "rope_type": ROPE_TYPES, "weights_dtype": WEIGHTS_DTYPES,
              "index_rope_pairing": ROPE_PAIRINGS}

    @classmethod
    def from_preset(cls, name: str) -> "LayerConfig":
        """A published model's configuration: "v2-lite", "v2", "v3", "kimi-k2", "glm-4.7-flash",
        "minicpm3-4b", "mistral-small-4", "moonlight"."""
        if not isinstance(name, str):
            _invalid("preset name must be a string")
        p = ctypes.c_int(0)
        _check(lib.clmla_preset_from_name(name.encode(), ctypes.byref(p)))
        c = _C["clmla_layer_config"]()
        _check(lib.clmla_layer_config_preset(p.value, ctypes.byref(c)))
        return cls._from_c(c)

    @classmethod
    def from_pretrained(cls, folder: Union[str, os.PathLike]) -> "LayerConfig":
        """The configuration every MLA layer of a model folder shares (its config.json)."""
        c = _C["clmla_layer_config"]()
        n = ctypes.c_int(0)
        _check(lib.clmla_model_read_config(os.fsencode(folder), ctypes.byref(c), ctypes.byref(n)))
        return cls._from_c(c)

    @classmethod
    def _from_c(cls, c) -> "LayerConfig":
        kw = {}
        pairs = c.qk_rope_head_dim // 2
        for f in dataclasses.fields(cls):
            if not hasattr(c, f.name):
                continue
            v = getattr(c, f.name)
            if f.name in cls._ENUMS:
                v = _name_of({k: x for k, x in cls._ENUMS[f.name].items() if k not in ("as_given", "half-split")}, v)
            elif f.name.startswith("longrope_"):
                v = tuple(float(v[i]) for i in range(min(pairs, len(v)))) if c.rope_type == 4 else ()
            kw[f.name] = v
        return cls(**kw)

    def _to_c(self):
        c = _C["clmla_layer_config"]()
        names = {n for n, _ in c._fields_}
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if f.name not in names:
                if v not in (0, None):
                    _invalid("%s is not supported by this libclmla (its header has no such field)" % f.name,
                             "CLMLA_ERROR_UNSUPPORTED")
                continue
            ctype = dict(c._fields_)[f.name]
            if f.name in self._ENUMS:
                v = _choice(v, f.name, self._ENUMS[f.name]) if isinstance(v, str) else _int(v, f.name)
            elif f.name.startswith("longrope_"):
                vals = list(v or ())
                if len(vals) > CONST["CLMLA_MAX_ROPE_PAIRS"]:
                    _invalid("%s has %d values, more than %d" % (f.name, len(vals), CONST["CLMLA_MAX_ROPE_PAIRS"]))
                arr = getattr(c, f.name)
                for i, x in enumerate(vals):
                    arr[i] = float(x)
                continue
            elif ctype is ctypes.c_double:
                if isinstance(v, bool) or not isinstance(v, (int, float, np.integer, np.floating)):
                    _invalid("%s must be a number, not %r" % (f.name, type(v).__name__))
                v = float(v)
            else:
                v = _int(v, f.name, -2 ** 31, 2 ** 31 - 1)
            setattr(c, f.name, v)
        return c

    def validate(self) -> None:
        """Raises clmla.Error (CLMLA_ERROR_INVALID_CONFIG) with the reason when the configuration is
        inconsistent."""
        c = self._to_c()
        _check(lib.clmla_layer_config_validate(ctypes.byref(c)))

    @property
    def softmax_scale(self) -> float:
        """tau of docs/MLA.md section 4."""
        c = self._to_c()
        s = ctypes.c_double(0)
        _check(lib.clmla_layer_config_softmax_scale(ctypes.byref(c), ctypes.byref(s)))
        return s.value

    def replace(self, **changes) -> "LayerConfig":
        return dataclasses.replace(self, **changes)


def presets() -> list:
    """The short names LayerConfig.from_preset takes."""
    out, i = [], 0
    while True:
        n = lib.clmla_preset_name(i)
        if not n:
            return out
        out.append(_text(n))
        i += 1


def model_types() -> str:
    """The config.json model_type values clmla runs, as one line of text."""
    return _text(lib.clmla_model_types())


# ---- weights ------------------------------------------------------------------------------------------------

@dataclass
class Weight:
    """A weight given as raw bits: ``Weight(uint16_array, "bf16")``, ``Weight(uint8_codes, "fp8",
    scale=float32 [ceil(rows/128), ceil(cols/128)])``, or any array with an explicit dtype."""
    data: Any
    dtype: str = "f32"
    scale: Any = None


_WEIGHT_NAMES = ("q_a_proj", "q_a_layernorm", "q_b_proj", "q_proj", "kv_a_proj_with_mqa", "kv_a_layernorm",
                 "kv_b_proj", "o_proj", "q_a_proj_bias", "kv_a_proj_with_mqa_bias", "o_proj_bias",
                 "indexer_wq_b", "indexer_wk", "indexer_k_norm", "indexer_k_norm_bias", "indexer_weights_proj")


def _weight_key(key: str) -> Tuple[str, str]:
    """'model.layers.3.self_attn.q_a_proj.weight' -> ('q_a_proj', 'weight'); also 'q_a_proj',
    'o_proj.bias' (-> 'o_proj_bias'), 'o_proj.weight_scale_inv' (-> 'o_proj', 'scale')."""
    k = key.split("self_attn.", 1)[-1]
    if k.startswith("indexer."):  # DSA's 'indexer.wq_b.weight' -> 'indexer_wq_b'
        k = "indexer_" + k[len("indexer."):]
    if k.endswith(".weight_scale_inv"):
        return k[: -len(".weight_scale_inv")], "scale"
    if k.endswith(".weight"):
        return k[: -len(".weight")], "weight"
    if k.endswith(".bias"):
        return k[: -len(".bias")] + "_bias", "weight"
    return k, "weight"


def _is_torch(v) -> bool:
    return type(v).__module__.split(".")[0] == "torch" and hasattr(v, "dtype") and hasattr(v, "device")


def _torch_to_numpy(t, what: str) -> Tuple[np.ndarray, Optional[int]]:
    """A CPU torch tensor as a numpy array and the clmla dtype of its raw bits (None: from numpy)."""
    torch = sys.modules["torch"]
    if t.device.type != "cpu":
        _invalid("%s is on %s: clmla takes CPU tensors (call .cpu())" % (what, t.device))
    t = t.detach().contiguous()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(np.uint16), 2
    f8 = getattr(torch, "float8_e4m3fn", None)
    if f8 is not None and t.dtype == f8:
        return t.view(torch.uint8).numpy(), 3
    if t.dtype in (torch.float32, torch.float16, torch.float64):
        return t.numpy(), None
    _invalid("%s has dtype %s: clmla takes float32, float16, bfloat16, float64 or float8_e4m3fn" % (what, t.dtype))


def _as_float_array(v, what: str, dtype=np.float32) -> np.ndarray:
    """Hidden states and other activations: any float array or CPU tensor -> C-contiguous float32."""
    if _is_torch(v):
        if v.device.type != "cpu":
            _invalid("%s is on %s: clmla takes CPU tensors (call .cpu())" % (what, v.device))
        if not v.dtype.is_floating_point or v.dtype.itemsize == 1:
            _invalid("%s has dtype %s: give float32, float16, bfloat16 or float64" % (what, v.dtype))
        v = v.detach().to(sys.modules["torch"].float32).contiguous().numpy()
    if not isinstance(v, np.ndarray):
        try:
            v = np.asarray(v)
        except Exception as e:
            _invalid("%s cannot be read as an array: %s" % (what, e))
    if v.dtype.kind != "f" or v.dtype.itemsize not in (2, 4, 8):
        _invalid("%s must hold floats (float16/32/64), not %s" % (what, v.dtype))
    return np.ascontiguousarray(v, dtype=dtype)


def _tensor(what: str, value, scale, keep: list):
    """A clmla_tensor for one weight; keep holds the arrays it points into."""
    t = _C["clmla_tensor"]()
    dt = None
    if isinstance(value, Weight):
        dt = _choice(value.dtype, "%s dtype" % what, {"f32": 0, "f16": 1, "bf16": 2, "fp8": 3})
        scale = value.scale if value.scale is not None else scale
        value = value.data
    if _is_torch(value):
        value, raw = _torch_to_numpy(value, what)
        dt = raw if raw is not None else dt
    if not isinstance(value, np.ndarray):
        try:
            value = np.asarray(value)
        except Exception as e:
            _invalid("%s cannot be read as an array: %s" % (what, e))
    if dt is None:
        if value.dtype == np.float32:
            dt = 0
        elif value.dtype == np.float16:
            dt = 1
        elif value.dtype == np.float64:
            value, dt = value.astype(np.float32), 0
        elif value.dtype.name == "bfloat16" and value.dtype.itemsize == 2:
            value, dt = value.view(np.uint16), 2
        elif value.dtype.name.startswith("float8_e4m3fn") and value.dtype.itemsize == 1:
            value, dt = value.view(np.uint8), 3
        else:
            _invalid("%s has dtype %s: give float32, float16, float64, bfloat16 or float8_e4m3fn "
                     "(raw bits: clmla.Weight(array, dtype))" % (what, value.dtype))
    else:
        want = {0: (np.float32,), 1: (np.float16, np.uint16, np.int16), 2: (np.uint16, np.int16),
                3: (np.uint8, np.int8)}[dt]
        if value.dtype.name == "bfloat16" and dt == 2:
            value = value.view(np.uint16)
        elif value.dtype.name.startswith("float8") and dt == 3:
            value = value.view(np.uint8)
        elif value.dtype.type not in want:
            _invalid("%s: a %s weight must be an array of %s, not %s" % (
                what, _DTYPE_NAMES[dt], "/".join(np.dtype(w).name for w in want), value.dtype))
    if value.ndim not in (1, 2):
        _invalid("%s must be 1-D or 2-D, not %d-D %s" % (what, value.ndim, value.shape), "CLMLA_ERROR_SHAPE_MISMATCH")
    if value.size == 0:
        _invalid("%s is empty %s" % (what, value.shape), "CLMLA_ERROR_SHAPE_MISMATCH")
    value = np.ascontiguousarray(value)
    keep.append(value)
    t.data = value.ctypes.data
    t.ndim = value.ndim
    t.shape[0] = value.shape[0]
    t.shape[1] = value.shape[1] if value.ndim == 2 else 0
    t.dtype = dt
    if dt == 3:
        if value.ndim != 2:
            _invalid("%s: fp8 weights must be 2-D" % what, "CLMLA_ERROR_SHAPE_MISMATCH")
        if scale is None:
            _invalid("%s: an fp8 weight needs its block scales (%s.weight_scale_inv)" % (what, what),
                     "CLMLA_ERROR_MISSING_TENSOR")
        s = _as_float_array(scale, what + " scale")
        want_shape = (-(-value.shape[0] // 128), -(-value.shape[1] // 128))
        if s.size != want_shape[0] * want_shape[1] or s.ndim != 2:
            _invalid("%s: the block scales must be %s, not %s" % (what, list(want_shape), list(s.shape)),
                     "CLMLA_ERROR_SHAPE_MISMATCH")
        keep.append(s)
        t.scale = s.ctypes.data_as(_P(ctypes.c_float))
    elif scale is not None:
        _invalid("%s: block scales are for fp8 weights only" % what)
    return t


def _weights_struct(weights: Mapping[str, Any], keep: list):
    if not isinstance(weights, Mapping):
        _invalid("weights must be a mapping of names to arrays (a state_dict), not %r" % type(weights).__name__)
    vals, scales, unknown = {}, {}, []
    for key, v in weights.items():
        if not isinstance(key, str):
            _invalid("weight names must be strings, not %r" % (key,))
        name, kind = _weight_key(key)
        if name not in _WEIGHT_NAMES:
            unknown.append(key)
            continue
        if v is None:
            continue
        (scales if kind == "scale" else vals)[name] = v
    if unknown:
        _invalid("unknown weights %s (expected %s, optionally as '<name>.weight', '<name>.bias' "
                 "or under a 'self_attn.' prefix)" % (", ".join(map(repr, unknown)), ", ".join(_WEIGHT_NAMES)))
    for name in scales:
        if name not in vals:
            _invalid("%s has block scales but no weight" % name, "CLMLA_ERROR_MISSING_TENSOR")
    w = _C["clmla_layer_weights"]()
    for name, v in vals.items():
        setattr(w, name, _tensor(name, v, scales.get(name), keep))
    return w


# ---- cache ---------------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class CacheInfo:
    bytes_per_token_per_layer: int
    bytes_per_block: int
    bytes_total: int
    block_tokens: int
    blocks_total: int
    blocks_used: int
    blocks_free: int
    sequences: int
    index_bytes_per_token_per_layer: int = 0


class Cache(_Owned):
    """The paged latent KV cache: ``num_blocks`` blocks of ``block_tokens`` tokens, shared by all
    sequences, each block spanning all ``layers``. ``kv_lora_rank`` and ``rope_dim`` come from
    ``config`` (a LayerConfig or Layer) unless given. ``dtype``: "f32", "f16", "bf16" or "fp8".
    Sequences are objects: ``seq = cache.add()``."""

    _destroy = staticmethod(lambda h: lib.clmla_cache_destroy(h))

    def __init__(self, context: Optional[Context] = None, *, blocks: int, layers: int = 1, block_tokens: int = 64,
                 dtype: str = "f32", kv_lora_rank: Optional[int] = None, rope_dim: Optional[int] = None,
                 config: Union["LayerConfig", "Layer", None] = None, index_head_dim: Optional[int] = None,
                 index_dtype: Optional[str] = None):
        self.context = _ctx(context)
        if isinstance(config, Layer):
            config = config.config
        if config is not None and not isinstance(config, LayerConfig):
            _invalid("config must be a LayerConfig or a Layer")
        if kv_lora_rank is None:
            if config is None:
                _invalid("give kv_lora_rank and rope_dim, or config=")
            kv_lora_rank = config.kv_lora_rank
        if rope_dim is None:
            if config is None:
                _invalid("give kv_lora_rank and rope_dim, or config=")
            rope_dim = config.qk_rope_head_dim
        cc = _C["clmla_cache_config"]()
        cc.num_layers = self.layers = _int(layers, "layers", 1, 1 << 20)
        cc.kv_lora_rank = self.kv_lora_rank = _int(kv_lora_rank, "kv_lora_rank", 1, 1 << 20)
        cc.rope_dim = self.rope_dim = _int(rope_dim, "rope_dim", 0, 1 << 20)
        cc.block_tokens = self.block_tokens = _int(block_tokens, "block_tokens", 1, 1 << 20)
        cc.num_blocks = self.num_blocks = _int(blocks, "blocks", 1, 2 ** 31 - 1)
        cc.dtype = _choice(dtype, "dtype", CACHE_DTYPES)
        self.dtype = dtype.lower()
        # the index-key cache of sparse-attention layers (DSA): from config's indexer unless given
        if index_head_dim is None:
            index_head_dim = config.index_head_dim if config is not None and config.index_n_heads > 0 else 0
        cc.index_head_dim = self.index_head_dim = _int(index_head_dim, "index_head_dim", 0, 1024)
        if index_dtype is None:  # as clmla run (clmla_cache_index_dtype)
            cc.index_dtype = lib.clmla_cache_index_dtype(cc.dtype, cc.index_head_dim)
        else:
            cc.index_dtype = _choice(index_dtype, "index_dtype", CACHE_DTYPES)
        h = ctypes.c_void_p()
        ch = self.context._require()
        _check(lib.clmla_cache_create(ch, ctypes.byref(cc), ctypes.byref(h)), ch)
        self._handle = h.value
        self._seqs = {}
        self.context._adopt(self)

    def _err(self, status):
        _check(status, self.context._handle)

    def close(self) -> None:
        for s in list(getattr(self, "_seqs", {}).values()):
            s._id = None
        super().close()

    def add(self) -> "Sequence":
        """A new, empty sequence."""
        sid = ctypes.c_int32(-1)
        self._err(lib.clmla_cache_seq_add(self._require(), ctypes.byref(sid)))
        return self._wrap(sid.value)

    def _wrap(self, sid: int) -> "Sequence":
        s = Sequence(self, sid)
        self._seqs[sid] = s
        return s

    @property
    def sequences(self) -> list:
        """The live sequences."""
        return [s for s in self._seqs.values() if s._id is not None]

    def info(self) -> CacheInfo:
        i = _C["clmla_cache_info"]()
        self._err(lib.clmla_cache_get_info(self._require(), ctypes.byref(i)))
        return CacheInfo(*(int(getattr(i, f)) for f, _ in i._fields_))

    def buffer(self, layer: int = 0) -> int:
        """The cl_mem of one layer's pool (owned by the cache)."""
        layer = _int(layer, "layer", 0, self.layers - 1)
        m = ctypes.c_void_p()
        self._err(lib.clmla_cache_layer_buffer(self._require(), layer, ctypes.byref(m)))
        return m.value or 0

    def index_buffer(self, layer: int = 0) -> int:
        """The cl_mem of one layer's index-key cache (owned by the cache; sparse-attention layers)."""
        layer = _int(layer, "layer", 0, self.layers - 1)
        m = ctypes.c_void_p()
        self._err(lib.clmla_cache_index_buffer(self._require(), layer, ctypes.byref(m)))
        return m.value or 0

    def __repr__(self):
        if not self._handle:
            return "<clmla.Cache (closed)>"
        i = self.info()
        return "<clmla.Cache %s, %d layers, %d/%d blocks of %d tokens used, %d sequences>" % (
            self.dtype, self.layers, i.blocks_used, i.blocks_total, i.block_tokens, i.sequences)


class Sequence:
    """One sequence of a Cache. Made by ``Cache.add()`` or ``Sequence.fork()``; ``free()`` ends it
    (any later use raises clmla.Error)."""

    def __init__(self, cache: Cache, sid: int):
        self.cache = cache
        self._id: Optional[int] = sid

    @property
    def id(self) -> int:
        """The C sequence id (ids are reused after a free)."""
        self._live()
        return self._id

    @property
    def freed(self) -> bool:
        return self._id is None

    def _live(self) -> int:
        if self._id is None:
            _invalid("the sequence was freed (or its cache closed)", "CLMLA_ERROR_UNKNOWN_SEQUENCE")
        self.cache._require()
        return self._id

    def free(self) -> None:
        """Returns the sequence's blocks to the pool."""
        sid = self._live()
        self.cache._err(lib.clmla_cache_seq_free(self.cache._handle, sid))
        self.cache._seqs.pop(sid, None)
        self._id = None

    def reserve(self, tokens: int) -> None:
        """Makes sure later appends up to ``tokens`` tokens in total cannot fail for lack of blocks."""
        sid = self._live()
        self.cache._err(lib.clmla_cache_seq_reserve(self.cache._handle, sid, _int(tokens, "tokens", 0, 2 ** 31 - 1)))

    def truncate(self, tokens: int) -> None:
        """Keeps the first ``tokens`` tokens in every layer."""
        sid = self._live()
        self.cache._err(lib.clmla_cache_seq_truncate(self.cache._handle, sid, _int(tokens, "tokens", 0, 2 ** 31 - 1)))

    def fork(self) -> "Sequence":
        """A new sequence sharing this one's tokens (copy on write)."""
        sid = self._live()
        new = ctypes.c_int32(-1)
        self.cache._err(lib.clmla_cache_seq_fork(self.cache._handle, sid, ctypes.byref(new)))
        return self.cache._wrap(new.value)

    def length(self, layer: int = 0) -> int:
        """Tokens stored in ``layer``."""
        sid = self._live()
        n = ctypes.c_int(0)
        self.cache._err(lib.clmla_cache_seq_length(self.cache._handle, sid, _int(layer, "layer", 0, self.cache.layers - 1),
                                                   ctypes.byref(n)))
        return n.value

    def __len__(self) -> int:
        return self.length(0)

    def blocks(self) -> list:
        """The block ids of the sequence, in order."""
        sid = self._live()
        cap = self.cache.num_blocks
        arr = (ctypes.c_int32 * cap)()
        n = ctypes.c_int(0)
        self.cache._err(lib.clmla_cache_seq_blocks(self.cache._handle, sid, arr, cap, ctypes.byref(n)))
        return list(arr[: min(n.value, cap)])

    def read(self, layer: int = 0, start: int = 0, n: Optional[int] = None) -> Tuple[np.ndarray, np.ndarray]:
        """Tokens [start, start+n) of ``layer`` as float32 ``(c_kv [n, rkv], k_rope [n, dr])``."""
        sid = self._live()
        layer = _int(layer, "layer", 0, self.cache.layers - 1)
        length = self.length(layer)
        start = _int(start, "start", 0, length)
        n = length - start if n is None else _int(n, "n", 0, length - start)
        ckv = np.zeros((n, self.cache.kv_lora_rank), np.float32)
        kr = np.zeros((n, self.cache.rope_dim), np.float32)
        if n:
            self.cache._err(lib.clmla_cache_read(self.cache._handle, layer, sid, start, n,
                                                 ckv.ctypes.data_as(_P(ctypes.c_float)),
                                                 kr.ctypes.data_as(_P(ctypes.c_float)) if kr.size else None))
        return ckv, kr

    def read_index(self, layer: int = 0, start: int = 0, n: Optional[int] = None) -> np.ndarray:
        """The index keys of tokens [start, start+n) of ``layer`` (a sparse-attention layer's, in a
        cache with an index-key cache) as float32 ``[n, index_head_dim]``."""
        sid = self._live()
        layer = _int(layer, "layer", 0, self.cache.layers - 1)
        length = self.length(layer)
        start = _int(start, "start", 0, length)
        n = length - start if n is None else _int(n, "n", 0, length - start)
        keys = np.zeros((n, max(self.cache.index_head_dim, 1)), np.float32)
        self.cache._err(lib.clmla_cache_read_index(self.cache._handle, layer, sid, start, n,
                                                   keys.ctypes.data_as(_P(ctypes.c_float))))
        return keys[:, : self.cache.index_head_dim]

    def append(self, c_kv, k_rope, layer: int = 0) -> None:
        """Appends n tokens to ``layer`` from host arrays: ``c_kv [n, rkv]`` after RMSNorm and
        ``k_rope [n, dr]`` after RoPE (for engines that run their own projections; copied through
        temporary device buffers; blocking)."""
        sid = self._live()
        layer = _int(layer, "layer", 0, self.cache.layers - 1)
        c = _as_float_array(c_kv, "c_kv")
        k = _as_float_array(k_rope, "k_rope")
        rkv, dr = self.cache.kv_lora_rank, self.cache.rope_dim
        if c.ndim != 2 or c.shape[1] != rkv or c.shape[0] < 1:
            _invalid("c_kv must be [n >= 1, %d], not %s" % (rkv, list(c.shape)), "CLMLA_ERROR_SHAPE_MISMATCH")
        if k.ndim != 2 or k.shape != (c.shape[0], dr):
            _invalid("k_rope must be [%d, %d], not %s" % (c.shape[0], dr, list(k.shape)), "CLMLA_ERROR_SHAPE_MISMATCH")
        ctx = self.cache.context
        ev = ctypes.c_void_p()
        with _cl.Buffers(ctx.cl_context, ctx.queue, _fail) as b:
            cm, km = b.upload(c), b.upload(k)
            self.cache._err(lib.clmla_cache_append_cl(self.cache._handle, layer, sid, c.shape[0], cm, 0, rkv, km, 0,
                                                      max(dr, 1), ctypes.byref(ev)))
            b.finish()
            _cl.release_event(ev.value)

    def __repr__(self):
        if self._id is None:
            return "<clmla.Sequence (freed)>"
        return "<clmla.Sequence %d: %d tokens>" % (self._id, self.length(0) if self.cache._handle else -1)


def _fail(code, message):
    raise Error(code, message)


# ---- layer -------------------------------------------------------------------------------------------------------------

class Layer(_Owned):
    """One MLA attention layer on a device.

    ``Layer(config, weights)`` from a LayerConfig and a mapping of weights (numpy arrays or CPU
    torch tensors; names as in the checkpoint, e.g. an attention module's ``state_dict()``), or
    ``Layer.from_pretrained(folder, layer=3)`` from a Hugging Face model folder. Calling the
    layer runs one step: ``out = layer(x, batch=[(seq, n_tokens), ...], cache=cache)``."""

    _destroy = staticmethod(lambda h: lib.clmla_layer_destroy(h))

    def __init__(self, config: LayerConfig, weights: Mapping[str, Any], *, context: Optional[Context] = None,
                 weights_dtype: Optional[str] = None, tp_rank: Optional[int] = None, tp_size: Optional[int] = None):
        if not isinstance(config, LayerConfig):
            _invalid("config must be a clmla.LayerConfig, not %r" % type(config).__name__)
        changes = {}
        if weights_dtype is not None:
            changes["weights_dtype"] = weights_dtype
        if tp_rank is not None:
            changes["tp_rank"] = tp_rank
        if tp_size is not None:
            changes["tp_size"] = tp_size
        if changes:
            config = config.replace(**changes)
        self.context = _ctx(context)
        c = config._to_c()
        keep: list = []
        w = _weights_struct(weights, keep)
        h = ctypes.c_void_p()
        ch = self.context._require()
        _check(lib.clmla_layer_create(ch, ctypes.byref(c), ctypes.byref(w), ctypes.byref(h)), ch)
        self._handle = h.value
        self.context._adopt(self)
        self._config = None

    @classmethod
    def from_pretrained(cls, folder: Union[str, os.PathLike], layer: int = 0, *, sublayer: int = 0,
                        weights_dtype: str = "auto", tp_rank: int = 0, tp_size: int = 1, dense: bool = False,
                        context: Optional[Context] = None) -> "Layer":
        """The attention of decoder layer ``layer`` of a model folder (config.json and safetensors,
        as published or as save_pretrained writes them). ``weights_dtype``: "auto" (as stored),
        "f32", "f16", "bf16", "fp8". ``tp_rank``/``tp_size``: load tensor-parallel shard
        ``tp_rank`` of ``tp_size`` (its heads only; the output is a partial sum to all-reduce).
        ``dense``: a sparse-attention model (deepseek_v32, glm_moe_dsa) without its indexer, every
        query attending to all its keys (for comparison)."""
        self = cls.__new__(cls)
        self.context = _ctx(context)
        o = _C["clmla_model_options"]()
        o.layer = _int(layer, "layer", 0)
        o.sublayer = _int(sublayer, "sublayer", 0)
        o.weights_dtype = _choice(weights_dtype, "weights_dtype", WEIGHTS_DTYPES)
        tp_rank = _int(tp_rank, "tp_rank")
        tp_size = _int(tp_size, "tp_size")
        if hasattr(o, "tp_size"):
            o.tp_rank, o.tp_size = tp_rank, tp_size
        elif tp_size not in (0, 1) or tp_rank:
            _invalid("tensor-parallel shards need libclmla 0.5", "CLMLA_ERROR_UNSUPPORTED")
        o.dense = 1 if dense else 0
        if not isinstance(folder, (str, os.PathLike)):
            _invalid("folder must be a path")
        h = ctypes.c_void_p()
        ch = self.context._require()
        _check(lib.clmla_layer_create_from_model_opts(ch, os.fsencode(folder), ctypes.byref(o), ctypes.byref(h)), ch)
        self._handle = h.value
        self.context._adopt(self)
        self._config = None
        return self

    @property
    def config(self) -> LayerConfig:
        """The layer's configuration (as clmla_layer_get_config reports it)."""
        if self._config is None:
            c = _C["clmla_layer_config"]()
            h = self._require()
            _check(lib.clmla_layer_get_config(h, ctypes.byref(c)), self.context._handle)
            self._config = LayerConfig._from_c(c)
        return self._config

    @property
    def auto_threshold(self) -> int:
        """Entries with at least this many tokens take the decompressed path under path="auto",
        whatever their sequence held; after a short prefix fewer do (auto_path)."""
        n = ctypes.c_int(0)
        _check(lib.clmla_layer_auto_threshold(self._require(), ctypes.byref(n)), self.context._handle)
        return n.value

    def auto_path(self, prefix: int, tokens: int) -> str:
        """The path path="auto" takes ("absorbed" or "decompressed") for an entry of `tokens` new
        tokens in a sequence holding `prefix` tokens before the step (clmla_layer_auto_path)."""
        p = ctypes.c_int(0)
        _check(lib.clmla_layer_auto_path(self._require(), int(prefix), int(tokens), ctypes.byref(p)),
               self.context._handle)
        return "decompressed" if p.value == PATHS["decompressed"] else "absorbed"

    def memory(self) -> dict:
        """Device bytes the layer holds, by checkpoint tensor (clmla_layer_memory)."""
        m = _C["clmla_layer_memory"]()
        _check(lib.clmla_layer_get_memory(self._require(), ctypes.byref(m)), self.context._handle)
        return {f: int(getattr(m, f)) for f, _ in m._fields_}

    def warmup(self, cache: Cache, cache_layer: int = 0) -> None:
        """Builds every kernel this layer's steps select with this cache now (needs free blocks for
        clmla.WARMUP_TOKENS tokens)."""
        h = self._require()
        self._same_context(cache)
        cl_ = _int(cache_layer, "cache_layer", 0, cache.layers - 1)
        _check(lib.clmla_layer_warmup(h, cache._require(), cl_), self.context._handle)

    def _same_context(self, cache):
        if not isinstance(cache, Cache):
            _invalid("cache must be a clmla.Cache, not %r" % type(cache).__name__)
        cache._require()
        if cache.context is not self.context:
            _invalid("the cache belongs to another context than the layer")

    def __call__(self, x, batch: Iterable[Tuple["Sequence", int]], cache: Optional[Cache] = None,
                 cache_layer: int = 0, path: str = "auto", out: Optional[np.ndarray] = None) -> np.ndarray:
        """One step: ``x [T, hidden_size]`` (float array or CPU tensor; rows are the batch entries'
        new tokens in order), ``batch`` a list of ``(sequence, n_tokens)`` whose n_tokens sum to T.
        Each entry's tokens are appended to its sequence in ``cache_layer`` of the cache. Returns
        the attention output after o_proj, float32 ``[T, hidden_size]`` (into ``out`` if given)."""
        return self.forward(x, batch, cache, cache_layer, path, out)

    def forward(self, x, batch, cache=None, cache_layer=0, path="auto", out=None) -> np.ndarray:
        h = self._require()
        cache, arr, n, xa, out = self._step_args(x, batch, cache, out)
        cache_layer = _int(cache_layer, "cache_layer", 0, cache.layers - 1)
        args = _C["clmla_forward_args"]()
        args.entries = arr
        args.num_entries = n
        args.cache_layer = cache_layer
        args.path = _choice(path, "path", PATHS)
        _check(lib.clmla_layer_forward(h, cache._handle, ctypes.byref(args), xa.ctypes.data_as(_P(ctypes.c_float)),
                                       out.ctypes.data_as(_P(ctypes.c_float))), self.context._handle)
        return out

    def _step_args(self, x, batch, cache, out):
        """A step's checked arguments: (cache, entries array, entry count, x as float32, out)."""
        if cache is None:
            if isinstance(batch, (list, tuple)) and batch and isinstance(batch[0], (list, tuple)) and \
                    batch[0] and isinstance(batch[0][0], Sequence):
                cache = batch[0][0].cache
            else:
                _invalid("give cache=")
        self._same_context(cache)
        cfg = self.config
        if cache.kv_lora_rank != cfg.kv_lora_rank or cache.rope_dim != cfg.qk_rope_head_dim:
            _invalid("the cache holds rows of %d + %d values, the layer needs %d + %d" % (
                cache.kv_lora_rank, cache.rope_dim, cfg.kv_lora_rank, cfg.qk_rope_head_dim),
                "CLMLA_ERROR_SHAPE_MISMATCH")
        if isinstance(batch, tuple) and len(batch) == 2 and isinstance(batch[0], Sequence):
            batch = [batch]
        try:
            entries = list(batch)
        except TypeError:
            _invalid("batch must be a list of (sequence, n_tokens)")
        if not entries:
            _invalid("batch is empty")
        arr = (_C["clmla_batch_entry"] * len(entries))()
        seen, total = set(), 0
        for i, e in enumerate(entries):
            if not isinstance(e, (tuple, list)) or len(e) != 2:
                _invalid("batch entry %d must be (sequence, n_tokens), not %r" % (i, e))
            seq, n = e
            if not isinstance(seq, Sequence):
                _invalid("batch entry %d: %r is not a clmla.Sequence" % (i, seq))
            if seq.cache is not cache:
                _invalid("batch entry %d: the sequence belongs to another cache" % i)
            sid = seq._live()
            if sid in seen:
                _invalid("batch entry %d: sequence %d appears twice in one step" % (i, sid))
            seen.add(sid)
            n = _int(n, "batch entry %d's n_tokens" % i, 1, 2 ** 31 - 1)
            arr[i].seq_id, arr[i].num_tokens = sid, n
            total += n
        D = cfg.hidden_size
        xa = _as_float_array(x, "x")
        if xa.ndim == 1 and total == 1:
            xa = xa.reshape(1, -1)
        if xa.ndim != 2 or xa.shape != (total, D):
            _invalid("x must be [%d, %d] (the batch's %d tokens by hidden_size), not %s" % (
                total, D, total, list(xa.shape)), "CLMLA_ERROR_SHAPE_MISMATCH")
        if out is None:
            out = np.empty((total, D), np.float32)
        elif not (isinstance(out, np.ndarray) and out.dtype == np.float32 and out.shape == (total, D)
                  and out.flags.c_contiguous and out.flags.writeable):
            _invalid("out must be a writeable C-contiguous float32 array of shape [%d, %d]" % (total, D))
        return cache, arr, len(entries), xa, out

    def __repr__(self):
        if not self._handle:
            return "<clmla.Layer (closed)>"
        c = self.config
        tp = " tp %d/%d" % (c.tp_rank, c.tp_size) if c.tp_size > 1 else ""
        return "<clmla.Layer D %d, %d heads, rq %d, rkv %d, %d/%d/%d%s>" % (
            c.hidden_size, c.num_heads, c.q_lora_rank, c.kv_lora_rank, c.qk_nope_head_dim, c.qk_rope_head_dim,
            c.v_head_dim, tp)


# ---- a model's attention layers over one cache --------------------------------------------------------------------

ATTENTION_KINDS = {"dense": 0, "indexed": 1, "shared": 2}


@dataclass
class ModelAttention:
    """One attention of a Model (clmla_model_attention): its decoder layer and sublayer, its layer of
    the model's cache, its kind ("dense", "indexed": its indexer selects keys, "shared": it takes
    the selection of attention ``source`` in the same step) and source (-1 unless shared)."""
    layer: int
    sublayer: int
    cache_layer: int
    kind: str
    source: int


class _Borrowed:
    """A Cache or Layer the Model owns: closing it does nothing; the model closes it."""
    _destroy = None


class _ModelCache(_Borrowed, Cache):
    pass


class _ModelLayer(_Borrowed, Layer):
    pass


class Model(_Owned):
    """A model's MLA attention layers over one cache (clmla_model): all of a folder's, or those of a
    range of decoder layers, run step by step in the model's order. The model carries what crosses
    layers: glm_moe_dsa's "shared" layers attend to the selection of the full layer before them in
    the same step.

        model = clmla.Model.from_pretrained(folder, layers=range(0, 4), blocks=64)
        seq = model.cache.add()
        out = model.run(x, [(seq, len(x))], between=lambda i, attn: mlp(i, attn))

    ``between(i, attention_out)`` returns the next attention's input: the engine's residual, norms and
    MLP or MoE. Or run the attentions one by one with ``model.forward(i, x, batch)``."""

    _destroy = staticmethod(lambda h: lib.clmla_model_destroy(h))

    @classmethod
    def from_pretrained(cls, folder: Union[str, os.PathLike], layers=None, *, blocks: int, block_tokens: int = 64,
                        cache_dtype: str = "f32", weights_dtype: str = "auto", tp_rank: int = 0, tp_size: int = 1,
                        dense: bool = False, context: Optional[Context] = None) -> "Model":
        """The MLA attentions of decoder ``layers`` (None: all; a range of step 1; or one int) of a
        model folder, and their cache of ``blocks`` blocks of ``block_tokens`` tokens in
        ``cache_dtype`` ("f32", "f16", "bf16", "fp8"). The other arguments as Layer.from_pretrained."""
        if not isinstance(folder, (str, os.PathLike)):
            _invalid("folder must be a path")
        first, count = 0, 0
        if isinstance(layers, range):
            if layers.step != 1 or len(layers) == 0:
                _invalid("layers must be a non-empty range of step 1, not %r" % (layers,))
            first, count = layers.start, len(layers)
        elif layers is not None:
            first, count = _int(layers, "layers", 0), 1
        self = cls.__new__(cls)
        self.context = _ctx(context)
        spec = _C["clmla_model_spec"]()
        spec.first_layer = _int(first, "layers' first", 0)
        spec.num_layers = count
        spec.weights_dtype = _choice(weights_dtype, "weights_dtype", WEIGHTS_DTYPES)
        spec.tp_rank, spec.tp_size = _int(tp_rank, "tp_rank"), _int(tp_size, "tp_size")
        spec.dense = 1 if dense else 0
        spec.cache_dtype = _choice(cache_dtype, "cache_dtype", CACHE_DTYPES)
        spec.block_tokens = _int(block_tokens, "block_tokens", 1, 1 << 20)
        spec.num_blocks = _int(blocks, "blocks", 1, 2 ** 31 - 1)
        h = ctypes.c_void_p()
        ch = self.context._require()
        _check(lib.clmla_model_create(ch, os.fsencode(folder), ctypes.byref(spec), ctypes.byref(h)), ch)
        self._handle = h.value
        self.context._adopt(self)
        self._describe(spec, cache_dtype)
        return self

    @classmethod
    def from_layers(cls, layers: Seq["Layer"], *, blocks: int, block_tokens: int = 64, cache_dtype: str = "f32") -> "Model":
        """A model of Layers the caller made, in the order a step runs them
        (clmla_model_create_from_layers): a layer with an indexer selects, a layer with
        ``index_shared`` takes the selection of the nearest one before it. The model makes its cache
        of ``blocks`` blocks; the layers stay the caller's (close the model before them)."""
        layers = list(layers)
        if not layers or not all(isinstance(layer, Layer) for layer in layers):
            _invalid("layers must be a non-empty list of clmla.Layer")
        context = layers[0].context
        if any(layer.context is not context for layer in layers):
            _invalid("the layers belong to different contexts")
        self = cls.__new__(cls)
        self.context = context
        spec = _C["clmla_model_spec"]()
        spec.cache_dtype = _choice(cache_dtype, "cache_dtype", CACHE_DTYPES)
        spec.block_tokens = _int(block_tokens, "block_tokens", 1, 1 << 20)
        spec.num_blocks = _int(blocks, "blocks", 1, 2 ** 31 - 1)
        arr = (ctypes.c_void_p * len(layers))(*[layer._require() for layer in layers])
        h = ctypes.c_void_p()
        ch = context._require()
        _check(lib.clmla_model_create_from_layers(ch, arr, len(layers), ctypes.byref(spec), ctypes.byref(h)), ch)
        self._handle = h.value
        context._adopt(self)
        self._describe(spec, cache_dtype)
        return self

    def _describe(self, spec, cache_dtype: str) -> None:
        """The attentions, layers and cache of the model just made, as Python objects."""
        ch = self.context._handle
        n = ctypes.c_int(0)
        _check(lib.clmla_model_num_attentions(self._handle, ctypes.byref(n)), ch)
        kinds = {v: k for k, v in ATTENTION_KINDS.items()}
        self.attentions = []
        self.layers = []
        for i in range(n.value):
            a = _C["clmla_model_attention"]()
            _check(lib.clmla_model_attention_info(self._handle, i, ctypes.byref(a)), ch)
            self.attentions.append(ModelAttention(a.layer, a.sublayer, a.cache_layer, kinds.get(a.kind, str(a.kind)),
                                                  a.source))
            lh = ctypes.c_void_p()
            _check(lib.clmla_model_layer(self._handle, i, ctypes.byref(lh)), ch)
            layer = _ModelLayer.__new__(_ModelLayer)
            layer.context, layer._handle, layer._config = self.context, lh.value, None
            self.layers.append(layer)
        cfg = self.layers[0].config
        c = ctypes.c_void_p()
        _check(lib.clmla_model_cache(self._handle, ctypes.byref(c)), ch)
        cache = _ModelCache.__new__(_ModelCache)
        cache.context, cache._handle, cache._seqs = self.context, c.value, {}
        cache.layers, cache.kv_lora_rank, cache.rope_dim = n.value, cfg.kv_lora_rank, cfg.qk_rope_head_dim
        cache.block_tokens, cache.num_blocks, cache.dtype = spec.block_tokens, spec.num_blocks, cache_dtype.lower()
        cache.index_head_dim = max((l.config.index_head_dim for l in self.layers if l.config.index_n_heads > 0),
                                   default=0)
        self.cache = cache

    def close(self) -> None:
        for borrowed in getattr(self, "layers", []) + ([self.cache] if getattr(self, "cache", None) else []):
            borrowed.close()
            borrowed._handle = None
        super().close()

    def forward(self, index: int, x, batch, path: str = "auto", out: Optional[np.ndarray] = None) -> np.ndarray:
        """Attention ``index`` of a step (clmla_model_forward): as Layer.forward in its cache layer of
        the model's cache. A shared attention runs only after its source ran the same step."""
        h = self._require()
        index = _int(index, "index", 0, len(self.layers) - 1)
        _, arr, n, xa, out = self.layers[index]._step_args(x, batch, self.cache, out)
        _check(lib.clmla_model_forward(h, index, arr, n, _choice(path, "path", PATHS),
                                       xa.ctypes.data_as(_P(ctypes.c_float)), out.ctypes.data_as(_P(ctypes.c_float))),
               self.context._handle)
        return out

    def forward_cl(self, index: int, x_mem: int, out_mem: int, batch, path: str = "auto", x_offset: int = 0,
                   out_offset: int = 0) -> None:
        """Attention ``index`` on device buffers (cl_mem handles, offsets in floats), enqueued on the
        context's queue without waiting (clmla_model_forward_cl): x [T, hidden_size] in, out after
        o_proj."""
        h = self._require()
        index = _int(index, "index", 0, len(self.layers) - 1)
        D = self.layers[index].config.hidden_size
        total = sum(n for _, n in batch) if isinstance(batch, (list, tuple)) else 0
        _, arr, n, _, _ = self.layers[index]._step_args(np.zeros((max(total, 1), D), np.float32), batch, self.cache,
                                                        None)
        _check(lib.clmla_model_forward_cl(h, index, arr, n, _choice(path, "path", PATHS), ctypes.c_void_p(x_mem),
                                          _int(x_offset, "x_offset", 0), ctypes.c_void_p(out_mem),
                                          _int(out_offset, "out_offset", 0), None), self.context._handle)

    def run(self, x, batch, between, path: str = "auto") -> np.ndarray:
        """A whole step (clmla_model_run): attention 0 on x, then for each next attention the input
        that ``between(i, attention_out)`` returns ([T, hidden_size]) from attention i's output.
        Returns the last attention's output. An exception in between stops the step and is raised."""
        h = self._require()
        if not callable(between):
            _invalid("between must be callable: between(index, attention_out) -> the next input")
        _, arr, n, xa, out = self.layers[0]._step_args(x, batch, self.cache, None)
        xw = np.array(xa, np.float32, order="C", copy=True)  # the step's inputs, rewritten between attentions
        shape = xw.shape
        raised = []

        def call(user, index, attention_out, nxt):
            try:
                y = between(index, np.ctypeslib.as_array(attention_out, shape=shape).copy())
                ya = _as_float_array(y, "between's result")
                if ya.shape != shape:
                    _invalid("between returned %s, the step's inputs are %s" % (list(ya.shape), list(shape)),
                             "CLMLA_ERROR_SHAPE_MISMATCH")
                ctypes.memmove(nxt, np.ascontiguousarray(ya, np.float32).ctypes.data, xw.nbytes)
                return 0
            except BaseException as e:  # raised again after the C call returns
                raised.append(e)
                return 1

        fn = ctype_of("clmla_model_between_fn")(call)
        st = lib.clmla_model_run(h, arr, n, _choice(path, "path", PATHS), xw.ctypes.data_as(_P(ctypes.c_float)),
                                 out.ctypes.data_as(_P(ctypes.c_float)), fn, None)
        if raised:
            raise raised[0]
        _check(st, self.context._handle)
        return out

    def __repr__(self):
        if not self._handle:
            return "<clmla.Model (closed)>"
        kinds = ",".join(a.kind[0] for a in self.attentions)
        return "<clmla.Model %d attentions (layers %d to %d: %s)>" % (
            len(self.attentions), self.attentions[0].layer, self.attentions[-1].layer, kinds)


# ---- linear ------------------------------------------------------------------------------------------------------------

class Linear(_Owned):
    """y = x W^T on clmla's product kernels, W [n, k] float32 uploaded once."""

    _destroy = staticmethod(lambda h: lib.clmla_linear_destroy(h))

    def __init__(self, weight, *, context: Optional[Context] = None):
        self.context = _ctx(context)
        w = _as_float_array(weight, "weight")
        if w.ndim != 2 or w.size == 0:
            _invalid("weight must be a non-empty 2-D array, not %s" % list(w.shape), "CLMLA_ERROR_SHAPE_MISMATCH")
        t = _C["clmla_tensor"]()
        t.data, t.ndim = w.ctypes.data, 2
        t.shape[0], t.shape[1] = w.shape
        h = ctypes.c_void_p()
        ch = self.context._require()
        _check(lib.clmla_linear_create(ch, ctypes.byref(t), ctypes.byref(h)), ch)
        self._handle = h.value
        self.out_features, self.in_features = w.shape
        self.context._adopt(self)

    def __call__(self, x) -> np.ndarray:
        h = self._require()
        xa = _as_float_array(x, "x")
        if xa.ndim != 2 or xa.shape[1] != self.in_features or xa.shape[0] < 1:
            _invalid("x must be [m >= 1, %d], not %s" % (self.in_features, list(xa.shape)), "CLMLA_ERROR_SHAPE_MISMATCH")
        y = np.empty((xa.shape[0], self.out_features), np.float32)
        _check(lib.clmla_linear_forward(h, xa.shape[0], xa.ctypes.data_as(_P(ctypes.c_float)),
                                        y.ctypes.data_as(_P(ctypes.c_float))), self.context._handle)
        return y

    def info(self) -> dict:
        i = _C["clmla_linear_info"]()
        _check(lib.clmla_linear_get_info(self._require(), ctypes.byref(i)), self.context._handle)
        return {f: int(getattr(i, f)) for f, _ in i._fields_}


# ---- latent attention alone --------------------------------------------------------------------------------------------

def _token_tables(cache: Cache, seqs, ctx_lens, T: int, layer: int):
    """The block table [sequences, max_blocks], token_seq [T] and ctx_lens [T] (int32) of a
    FlashMLA-style call, after checking every sequence and length."""
    seqs = list(seqs)
    if len(seqs) != T:
        _invalid("seqs must give one sequence per token (%d), not %d" % (T, len(seqs)))
    lens = [_int(n, "ctx_lens[%d]" % i, 0) for i, n in enumerate(list(ctx_lens))]
    if len(lens) != T:
        _invalid("ctx_lens must give one length per token (%d), not %d" % (T, len(lens)))
    rows, order = {}, []
    for t, s in enumerate(seqs):
        if not isinstance(s, Sequence) or s.cache is not cache:
            _invalid("seqs[%d] is not a sequence of this cache" % t)
        sid = s._live()
        if sid not in rows:
            rows[sid] = len(order)
            order.append(s)
        if lens[t] > s.length(layer):
            _invalid("ctx_lens[%d] = %d is more than the %d tokens sequence %d holds in layer %d" % (
                t, lens[t], s.length(layer), sid, layer))
    tables = [s.blocks() for s in order]
    mb = max(1, max(len(b) for b in tables))
    bt = np.zeros((len(order), mb), np.int32)
    for i, b in enumerate(tables):
        if b:
            bt[i, : len(b)] = b
            bt[i, len(b):] = b[-1]
    token_seq = np.array([rows[s._id] for s in seqs], np.int32)
    lens_a = np.array(lens, np.int32)
    return bt, token_seq, lens_a


def latent_attention(cache: Cache, q_latent, q_rope, seqs: Seq["Sequence"], ctx_lens, softmax_scale: float, *,
                     layer: int = 0, return_lse: bool = False, indices=None, query_len: int = 0):
    """FlashMLA-style absorbed attention over the paged cache, for engines that run their own
    projections (clmla_attention_latent on host arrays: the arrays go through temporary device
    buffers, and the call blocks).

    ``q_latent [T, H, rkv]`` (q~_h = W^UK_h^T q^C_h), ``q_rope [T, H, dr]`` (after RoPE), token t
    attends to keys ``0 .. ctx_lens[t]-1`` of ``seqs[t]`` in cache ``layer``. Returns
    ``out [T, H, rkv]`` float32 (and ``lse [T, H]``, natural log, with ``return_lse``).

    ``indices [T, topk]`` (integers, optional): sparse attention (clmla_attention_latent_sparse, as
    DeepSeek-V3.2's top-k selection gives it): token t attends only to the positions
    ``indices[t]`` of its sequence; entries < 0 (the padding, -1) or >= ``ctx_lens[t]`` are no key,
    and a token left with none gets 0 and lse -inf.

    ``query_len`` (multi-token decode, FlashMLA's seqlen_q): tokens ``b*q .. b*q+q-1`` are ``q`` new
    tokens of one sequence, each with its own ``ctx_lens`` entry; a GPU then reads the cache once
    for several of them (clmla_latent_attention_args.query_len). The result is that of 0."""
    if not isinstance(cache, Cache):
        _invalid("cache must be a clmla.Cache")
    ch = cache._require()
    layer = _int(layer, "layer", 0, cache.layers - 1)
    query_len = _int(query_len, "query_len", 0, 2 ** 31 - 1)
    ql = _as_float_array(q_latent, "q_latent")
    qr = _as_float_array(q_rope, "q_rope")
    rkv, dr = cache.kv_lora_rank, cache.rope_dim
    if ql.ndim != 3 or ql.shape[2] != rkv or ql.shape[0] < 1 or ql.shape[1] < 1:
        _invalid("q_latent must be [T, H, %d], not %s" % (rkv, list(ql.shape)), "CLMLA_ERROR_SHAPE_MISMATCH")
    T, H = ql.shape[:2]
    if qr.shape != (T, H, dr):
        _invalid("q_rope must be [%d, %d, %d], not %s" % (T, H, dr, list(qr.shape)), "CLMLA_ERROR_SHAPE_MISMATCH")
    if isinstance(softmax_scale, bool) or not isinstance(softmax_scale, (int, float, np.floating, np.integer)) or \
            not math.isfinite(float(softmax_scale)):
        _invalid("softmax_scale must be a finite number")
    bt, token_seq, lens_a = _token_tables(cache, seqs, ctx_lens, T, layer)
    mb, lens = bt.shape[1], lens_a.tolist()
    idx = None
    if indices is not None:
        idx = np.asarray(indices)
        if idx.ndim != 2 or idx.shape[0] != T or not 1 <= idx.shape[1] <= CONST["CLMLA_SPARSE_MAX_TOPK"]:
            _invalid("indices must be [%d, topk] with topk 1..%d, not %s" % (
                T, CONST["CLMLA_SPARSE_MAX_TOPK"], list(idx.shape)), "CLMLA_ERROR_SHAPE_MISMATCH")
        if idx.dtype.kind not in "iu":
            _invalid("indices must be integers, not %s" % idx.dtype)
        idx = np.ascontiguousarray(np.clip(idx, -1, 2 ** 31 - 1).astype(np.int32))
    ctx = cache.context
    out = np.empty((T, H, rkv), np.float32)
    lse = np.empty((T, H), np.float32)
    a = _C["clmla_latent_attention_args"]()
    a.num_tokens, a.num_heads, a.softmax_scale = T, H, float(softmax_scale)
    a.max_blocks_per_seq = mb
    a.max_ctx_len = int(max(lens))
    a.query_len = query_len
    ev = ctypes.c_void_p()
    with _cl.Buffers(ctx.cl_context, ctx.queue, _fail) as b:
        a.q_latent, a.q_rope = b.upload(ql), b.upload(qr)
        a.block_table, a.token_seq, a.token_ctx_len = b.upload(bt), b.upload(token_seq), b.upload(lens_a)
        a.out, a.lse = b.empty(out.nbytes), b.empty(lse.nbytes)
        if idx is None:
            _check(lib.clmla_attention_latent(ch, layer, ctypes.byref(a), ctypes.byref(ev)), ctx._handle)
        else:
            _check(lib.clmla_attention_latent_sparse(ch, layer, ctypes.byref(a), b.upload(idx), 0, idx.shape[1],
                                                     ctypes.byref(ev)), ctx._handle)
        b.finish()
        _cl.release_event(ev.value)
        b.download(a.out, out)
        b.download(a.lse, lse)
    return (out, lse) if return_lse else out


def index_select(cache: Cache, q, weights, seqs: Seq["Sequence"], ctx_lens, top_k: int, *, layer: int = 0):
    """DeepSeek Sparse Attention's selection over the cache's index keys (clmla_index_select on host
    arrays, through temporary device buffers; blocking), for engines that run the indexer's
    projections themselves: ``q [T, H_I, d_I]`` after RoPE, ``weights [T, H_I]`` with the indexer's
    scale, token t scoring positions ``0 .. ctx_lens[t]-1`` of ``seqs[t]`` with
    sum_h weights[t, h] ReLU(q[t, h] . k_s). Returns ``indices [T, top_k]`` int32: the best
    min(top_k, ctx_lens[t]) positions in ascending order (ties: the earlier), -1 padded; ready for
    ``latent_attention(..., indices=)``."""
    if not isinstance(cache, Cache):
        _invalid("cache must be a clmla.Cache")
    ch = cache._require()
    layer = _int(layer, "layer", 0, cache.layers - 1)
    if not cache.index_head_dim:
        _invalid("the cache has no index-key cache (index_head_dim 0)")
    qa = _as_float_array(q, "q")
    wa = _as_float_array(weights, "weights")
    if qa.ndim != 3 or qa.shape[2] != cache.index_head_dim or qa.shape[0] < 1 or qa.shape[1] < 1:
        _invalid("q must be [T, H_I, %d], not %s" % (cache.index_head_dim, list(qa.shape)), "CLMLA_ERROR_SHAPE_MISMATCH")
    T, HI = qa.shape[:2]
    if wa.shape != (T, HI):
        _invalid("weights must be [%d, %d], not %s" % (T, HI, list(wa.shape)), "CLMLA_ERROR_SHAPE_MISMATCH")
    top_k = _int(top_k, "top_k", 1, CONST["CLMLA_SPARSE_MAX_TOPK"])
    bt, token_seq, lens_a = _token_tables(cache, seqs, ctx_lens, T, layer)
    ctx = cache.context
    out = np.empty((T, top_k), np.int32)
    a = _C["clmla_index_select_args"]()
    a.num_tokens, a.num_heads, a.top_k = T, HI, top_k
    a.max_blocks_per_seq = bt.shape[1]
    a.max_ctx_len = max(1, int(lens_a.max()))
    ev = ctypes.c_void_p()
    with _cl.Buffers(ctx.cl_context, ctx.queue, _fail) as b:
        a.q, a.weights = b.upload(qa), b.upload(wa)
        a.block_table, a.token_seq, a.token_ctx_len = b.upload(bt), b.upload(token_seq), b.upload(lens_a)
        a.indices = b.empty(out.nbytes)
        _check(lib.clmla_index_select(ch, layer, ctypes.byref(a), ctypes.byref(ev)), ctx._handle)
        b.finish()
        _cl.release_event(ev.value)
        b.download(a.indices, out)
    return out
