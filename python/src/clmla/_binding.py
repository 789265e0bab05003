"""The ctypes binding of libclmla, built from the declaration table of include/clmla.h and
include/clmla_tuning.h (_decls.py).

Every function, struct and enumerator of the headers is here, under its C name:
``lib.clmla_layer_forward``, ``STRUCTS["clmla_layer_config"]``, ``CONST["CLMLA_CACHE_F16"]``; the
tuning header's too (``lib.clmla_latent_tuning_lookup``). This module is the low level; the classes
in clmla/__init__.py are the API. The table is checked against the headers by
python/tests/test_header.py (names, types and order of every parameter and field), and the struct
layouts against the C compiler's sizeof/offsetof.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import glob
import os
import re

from . import _decls

__all__ = ["lib", "STRUCTS", "CONST", "ctype_of", "library_path", "LOG_FN"]

# The C types of the header that are plain scalars (enums are int on every ABI clmla targets).
_SCALARS = {
    "int": ctypes.c_int,
    "unsigned": ctypes.c_uint,
    "int32_t": ctypes.c_int32,
    "int64_t": ctypes.c_int64,
    "uint32_t": ctypes.c_uint32,
    "uint64_t": ctypes.c_uint64,
    "size_t": ctypes.c_size_t,
    "double": ctypes.c_double,
    "float": ctypes.c_float,
    "char": ctypes.c_char,
}
# OpenCL handles are pointers to opaque structs.
_CL_HANDLES = {"cl_mem", "cl_event", "cl_context", "cl_command_queue", "cl_device_id", "cl_platform_id"}

STRUCTS: dict = {}
_FNPTRS: dict = {}


def _base_ctype(name):
    if name in _SCALARS:
        return _SCALARS[name]
    if name in _decls.TYPEDEFS:
        t = _decls.TYPEDEFS[name]
        if t == "enum":
            return ctypes.c_int
        return ctype_of(t)
    if name in STRUCTS:
        return STRUCTS[name]
    raise TypeError("no ctypes type for C type %r" % name)


def ctype_of(t: str):
    """The ctypes type of a canonical C type string of the declaration table."""
    m = re.match(r"^(.*)\(\*\)\((.*)\)$", t)
    if m:  # function pointer
        if t not in _FNPTRS:
            ret = None if m.group(1) == "void" else ctype_of(m.group(1))
            params = [ctype_of(p) for p in m.group(2).split(",") if p]
            _FNPTRS[t] = ctypes.CFUNCTYPE(ret, *params)
        return _FNPTRS[t]
    m = re.match(r"^(.*?)((?:\[\d+\])+)$", t)
    if m:  # array field
        ct = ctype_of(m.group(1))
        for n in reversed(re.findall(r"\[(\d+)\]", m.group(2))):
            ct = ct * int(n)
        return ct
    base = t.replace("const ", "")
    stars = len(base) - len(base.rstrip("*"))
    base = base.rstrip("*")
    if stars == 0:
        if base == "void":
            return None
        if base in _CL_HANDLES:
            return ctypes.c_void_p
        return _base_ctype(base)
    # pointers
    if base in ("void",) or base in _decls.OPAQUE or base in _CL_HANDLES:
        inner, stars = ctypes.c_void_p, stars - 1
    elif base == "char":
        inner, stars = (ctypes.c_char_p, stars - 1) if t.startswith("const") else (ctypes.c_char, stars)
    else:
        inner = _base_ctype(base)
    for _ in range(stars):
        inner = ctypes.POINTER(inner)
    return inner


def _build_structs():
    for name in _decls.STRUCTS:
        STRUCTS[name] = type(name, (ctypes.Structure,), {})
    done = set()

    def define(name):
        if name in done:
            return
        for _, t in _decls.STRUCTS[name]:
            b = t.replace("const ", "")
            b = re.sub(r"\[\d+\]", "", b)
            if b in _decls.STRUCTS:  # by value: define it first
                define(b)
        STRUCTS[name]._fields_ = [(f, ctype_of(t)) for f, t in _decls.STRUCTS[name]]
        done.add(name)

    for name in _decls.STRUCTS:
        define(name)


_build_structs()

CONST: dict = dict(_decls.DEFINES)
for _values in _decls.ENUMS.values():
    CONST.update(_values)

LOG_FN = ctype_of("clmla_log_fn")

# ---- loading --------------------------------------------------------------------------------------

# The system libraries libclmla needs, and the Debian package of each.
_SYSTEM_LIBS = [
    ("libOpenCL.so.1", "ocl-icd-libopencl1", "the OpenCL ICD loader"),
    ("libclblast.so.1", "libclblast1", "CLBlast"),
    ("libcjson.so.1", "libcjson1", "cJSON"),
]


def _candidates():
    env = os.environ.get("CLMLA_LIBRARY")
    if env:
        return [env], True
    here = os.path.dirname(os.path.abspath(__file__))
    found = sorted(glob.glob(os.path.join(here, "lib", "libclmla.so*")) +
                   glob.glob(os.path.join(here, "libclmla.so*")) +
                   glob.glob(os.path.join(here, "lib", "libclmla*.dylib")),
                   key=len)
    if found:
        return found[:1], True
    sys_lib = ctypes.util.find_library("clmla")
    return ([sys_lib] if sys_lib else []), False


def _missing_system_library(message):
    for soname, package, what in _SYSTEM_LIBS:
        if soname.split(".so")[0] in message:
            return "%s (%s) is missing: install it, e.g. `apt-get install %s` on Debian/Ubuntu" % (
                soname, what, package)
    for soname, package, what in _SYSTEM_LIBS:
        try:
            ctypes.CDLL(soname)
        except OSError:
            return "%s (%s) is missing: install it, e.g. `apt-get install %s` on Debian/Ubuntu" % (
                soname, what, package)
    return None


def _load():
    paths, bundled = _candidates()
    if not paths:
        raise ImportError(
            "clmla: libclmla was not found: not in the package (clmla/lib/), CLMLA_LIBRARY is not set and "
            "there is no system libclmla. Install the package with `pip install ./python`, or set "
            "CLMLA_LIBRARY=/path/to/libclmla.so")
    path = paths[0]
    try:
        return ctypes.CDLL(path), path
    except OSError as e:
        missing = _missing_system_library(str(e))
        if missing:
            raise ImportError("clmla: cannot load %s: %s" % (path, missing)) from e
        raise ImportError("clmla: cannot load %s: %s" % (path, e)) from e


lib, library_path = _load()

_missing = []
for _name, (_ret, _params) in _decls.FUNCTIONS.items():
    try:
        _fn = getattr(lib, _name)
    except AttributeError:
        _missing.append(_name)
        continue
    _fn.restype = ctype_of(_ret)
    _fn.argtypes = [ctype_of(t) for _, t in _params]
if _missing:
    raise ImportError("clmla: %s does not export %s: it is older than the package's header (%d.%d.%d)" % (
        library_path, ", ".join(_missing), CONST["CLMLA_VERSION_MAJOR"], CONST["CLMLA_VERSION_MINOR"],
        CONST["CLMLA_VERSION_PATCH"]))
