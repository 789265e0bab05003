"""The binding against include/clmla.h and include/clmla_tuning.h: the declaration table the ctypes
binding is built from must be the headers' own (every function's return and parameter types, every
struct's fields in order, every enumerator and #define), ctypes' struct layouts must be the C
compiler's, the stable header must not need the tuning header, and the Python API must cover every
field it mirrors. A changed signature or struct fails here."""

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
TUNING_HEADER = os.path.join(os.path.dirname(HEADER), "clmla_tuning.h")
REGEN = "run: " + clmla_header.COMMAND


def _need_headers():
    for path in (HEADER, TUNING_HEADER):
        if not os.path.exists(path):
            pytest.skip("%s not found (set CLMLA_HEADER to clmla.h, beside clmla_tuning.h)" % path)


@pytest.fixture(scope="module")
def header():
    """Both headers, read as one: what the binding wraps."""
    _need_headers()
    return clmla_header.parse(HEADER, TUNING_HEADER)


def test_functions_match_header(header):
    want, have = header["functions"], _decls.FUNCTIONS
    missing = sorted(set(want) - set(have))
    extra = sorted(set(have) - set(want))
    assert not missing, "functions in the headers but not in the binding: %s; %s" % (missing, REGEN)
    assert not extra, "functions in the binding but no longer in the headers: %s; %s" % (extra, REGEN)
    for name, (ret, params) in want.items():
        hret, hparams = have[name]
        assert hret == ret, "%s returns %s in the headers, %s in the binding; %s" % (name, ret, hret, REGEN)
        assert [t for _, t in hparams] == [t for _, t in params], (
            "%s(%s) in the headers, (%s) in the binding; %s" % (
                name, ", ".join(t for _, t in params), ", ".join(t for _, t in hparams), REGEN))


def test_structs_match_header(header):
    want, have = header["structs"], _decls.STRUCTS
    assert sorted(want) == sorted(have), REGEN
    for name, fields in want.items():
        assert [tuple(f) for f in have[name]] == [tuple(f) for f in fields], (
            "struct %s differs from the headers: %s" % (name, REGEN))


def test_enums_defines_typedefs_match_header(header):
    assert header["enums"] == _decls.ENUMS, REGEN
    assert header["defines"] == _decls.DEFINES, REGEN
    assert header["typedefs"] == _decls.TYPEDEFS, REGEN
    assert header["opaque"] == _decls.OPAQUE, REGEN


def test_stable_header_stands_alone():
    """clmla.h declares nothing of clmla_tuning.h and names none of its types or #defines, so that an
    engine includes it alone; the tuning header holds the tuning structs and calls."""
    _need_headers()
    stable = clmla_header.parse(HEADER)
    tuning = clmla_header.parse(TUNING_HEADER)
    for key in ("defines", "structs", "functions", "typedefs"):
        both = sorted(set(stable[key]) & set(tuning[key]))
        assert not both, "%s in both headers: %s" % (key, both)
    tuning_names = set(tuning["structs"]) | set(tuning["defines"]) | set(tuning["typedefs"])
    used = [(name, ret) for name, (ret, _) in stable["functions"].items()]
    used += [(name, t) for name, (_, params) in stable["functions"].items() for _, t in params]
    used += [(name, t) for name, fields in stable["structs"].items() for _, t in fields]
    for name, t in used:
        assert not tuning_names & set(re.findall(r"\w+", t)), "clmla.h's %s uses %s of clmla_tuning.h" % (name, t)
    assert {"clmla_latent_tuning", "clmla_product_tuning", "clmla_xgemm_tuning"} <= set(tuning["structs"])
    assert not [n for n in stable["functions"] if "tuning" in n or "xgemm" in n], "tuning calls left in clmla.h"


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
    if not cc or not os.path.exists(HEADER) or not os.path.exists(TUNING_HEADER):
        pytest.skip("no C compiler or no clmla.h and clmla_tuning.h")
    lines = ["#include <stdio.h>", "#include <stddef.h>", '#include "clmla_tuning.h"', "int main(void) {"]
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
