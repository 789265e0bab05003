"""The binding against include/clmla.h: the declaration table the ctypes binding is built from must
be the header's own (every function's return and parameter types, every struct's fields in order,
every enumerator and #define), ctypes' struct layouts must be the C compiler's, and the Python
API must cover every field it mirrors. A changed signature or struct fails here."""

import ctypes
import dataclasses
import os
import re
import shutil
import subprocess
import sys

import pytest

import clmla
from clmla import _decls
from clmla._binding import STRUCTS, ctype_of, lib

from conftest import HERE, REPO

sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tools"))
import clmla_header  # noqa: E402

HEADER = os.environ.get("CLMLA_HEADER") or os.path.join(REPO, "include", "clmla.h")
REGEN = "run: python3 python/tools/clmla_header.py include/clmla.h > python/src/clmla/_decls.py"


@pytest.fixture(scope="module")
def header():
    if not os.path.exists(HEADER):
        pytest.skip("clmla.h not found (set CLMLA_HEADER)")
    return clmla_header.parse(HEADER)


def test_functions_match_header(header):
    want, have = header["functions"], _decls.FUNCTIONS
    missing = sorted(set(want) - set(have))
    extra = sorted(set(have) - set(want))
    assert not missing, "functions in clmla.h but not in the binding: %s; %s" % (missing, REGEN)
    assert not extra, "functions in the binding but no longer in clmla.h: %s; %s" % (extra, REGEN)
    for name, (ret, params) in want.items():
        hret, hparams = have[name]
        assert hret == ret, "%s returns %s in clmla.h, %s in the binding; %s" % (name, ret, hret, REGEN)
        assert [t for _, t in hparams] == [t for _, t in params], (
            "%s(%s) in clmla.h, (%s) in the binding; %s" % (
                name, ", ".join(t for _, t in params), ", ".join(t for _, t in hparams), REGEN))


def test_structs_match_header(header):
    want, have = header["structs"], _decls.STRUCTS
    assert sorted(want) == sorted(have), REGEN
    for name, fields in want.items():
        assert [tuple(f) for f in have[name]] == [tuple(f) for f in fields], (
            "struct %s differs from clmla.h: %s" % (name, REGEN))


def test_enums_defines_typedefs_match_header(header):
    assert header["enums"] == _decls.ENUMS, REGEN
    assert header["defines"] == _decls.DEFINES, REGEN
    assert header["typedefs"] == _decls.TYPEDEFS, REGEN
    assert header["opaque"] == _decls.OPAQUE, REGEN


def test_generated_file_is_current(header):
    """The committed table is exactly what the generator writes."""
    path = os.path.join(os.path.dirname(HERE), "src", "clmla", "_decls.py")
    if not os.path.exists(path):
        pytest.skip("not run from the source tree")
    with open(path) as f:
        assert f.read() == clmla_header.render(header), REGEN


def test_binding_types():
    """Every function of the table is bound with the ctypes types its C types map to."""
    for name, (ret, params) in _decls.FUNCTIONS.items():
        fn = getattr(lib, name)
        assert fn.restype == ctype_of(ret), name
        assert list(fn.argtypes) == [ctype_of(t) for _, t in params], name


def test_struct_layouts_match_compiler(tmp_path):
    """sizeof and offsetof of every struct and field as the C compiler lays them out."""
    cc = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc") or shutil.which("clang")
    if not cc or not os.path.exists(HEADER):
        pytest.skip("no C compiler or no clmla.h")
    lines = ["#include <stdio.h>", "#include <stddef.h>", '#include "clmla.h"', "int main(void) {"]
    for name, fields in _decls.STRUCTS.items():
        lines.append('printf("%s %%zu\\n", sizeof(%s));' % (name, name))
        for f, _ in fields:
            lines.append('printf("%s.%s %%zu\\n", offsetof(%s, %s));' % (name, f, name, f))
    lines.append("return 0; }")
    src = tmp_path / "layout.c"
    src.write_text("\n".join(lines))
    exe = tmp_path / "layout"
    r = subprocess.run([cc, "-std=c11", "-I", os.path.dirname(HEADER), str(src), "-o", str(exe)],
                       capture_output=True, text=True)
    if r.returncode != 0 and "CL/cl.h" in r.stderr:
        pytest.skip("OpenCL headers are not installed")
    assert r.returncode == 0, r.stderr
    out = subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout
    for line in out.splitlines():
        key, value = line.split()
        if "." in key:
            s, f = key.split(".")
            assert getattr(STRUCTS[s], f).offset == int(value), key
        else:
            assert ctypes.sizeof(STRUCTS[key]) == int(value), key


def test_layer_config_mirrors_struct():
    names = [f.name for f in dataclasses.fields(clmla.LayerConfig)]
    c_names = [f for f, _ in _decls.STRUCTS["clmla_layer_config"]]
    assert names == c_names, "clmla.LayerConfig's fields differ from clmla_layer_config's"


def test_mirrored_structs_cover_fields():
    """The Python objects that copy a struct field by field name every field."""
    assert [f.name for f in dataclasses.fields(clmla.Device)] == [
        f for f, _ in _decls.STRUCTS["clmla_device_info"] if f not in ("platform_id", "device_id")]
    assert [f.name for f in dataclasses.fields(clmla.CacheInfo)] == [
        f for f, _ in _decls.STRUCTS["clmla_cache_info"]]
    weights = [f for f, _ in _decls.STRUCTS["clmla_layer_weights"]]
    from clmla._core import _WEIGHT_NAMES
    assert list(_WEIGHT_NAMES) == weights
    model_opts = [f for f, _ in _decls.STRUCTS["clmla_model_options"]]
    assert model_opts == ["layer", "sublayer", "weights_dtype", "tp_rank", "tp_size", "dense"], model_opts


def test_enum_names_used_by_the_api():
    from clmla import _core
    e = _decls.ENUMS
    assert _core.CACHE_DTYPES == {k.split("_")[-1].lower(): v for k, v in e["clmla_cache_dtype"].items()}
    assert _core.PATHS == {k.split("_")[-1].lower(): v for k, v in e["clmla_attention_path"].items()}
    wd = {"as_given" if k.endswith("AS_GIVEN") else k.split("_")[-1].lower(): v
          for k, v in e["clmla_weights_dtype"].items()}
    assert {k: v for k, v in _core.WEIGHTS_DTYPES.items() if k != "auto"} == wd
    rt = {k[len("CLMLA_ROPE_TYPE_"):].lower(): v for k, v in e["clmla_rope_type"].items()}
    assert _core.ROPE_TYPES == rt
    assert _core.LOG_LEVELS == {k.split("_")[-1].lower(): v for k, v in e["clmla_log_level"].items()}


def test_version_follows_header(header):
    d = header["defines"]
    v = "%d.%d.%d" % (d["CLMLA_VERSION_MAJOR"], d["CLMLA_VERSION_MINOR"], d["CLMLA_VERSION_PATCH"])
    assert clmla.__version__ == v
    assert clmla.version() == v, "the loaded libclmla (%s) is not the header's version" % clmla.library_path
    try:
        from importlib.metadata import PackageNotFoundError, version
        assert version("clmla") == v
    except PackageNotFoundError:
        pass  # run from the source tree without pip


def test_every_function_is_called_somewhere():
    """Each C function is used by the package or by a test of this directory."""
    src = ""
    pkg = os.path.dirname(clmla.__file__)
    for d in (pkg, HERE):
        for fn in os.listdir(d):
            if fn.endswith(".py") and fn != "_decls.py":
                with open(os.path.join(d, fn)) as f:
                    src += f.read()
    unused = [n for n in _decls.FUNCTIONS if not re.search(r"\b%s\b" % n, src)]
    assert not unused, "functions neither wrapped nor tested: %s" % unused
