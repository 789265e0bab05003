#!/usr/bin/env python3
"""Every vendor's compiler on the programs clmla would build on each profiled device.

For every device profile (tools/vendor/profiles/*.json), `clmla kernels --profile FILE --record DIR`
runs the library's own selection (kernels, tuning tables, build options, work-group sizes) against
an OpenCL driver that reports the profile (tools/vendor/profile_icd.c) and records each program's
exact source and options, the kernels created from it and the work-group shapes launched. Each of
those programs is then compiled offline by that vendor's compiler:

  AMD     clang-15 for amdgcn-amd-amdhsa with ROCm's device libraries (rocm-device-libs), as ROCm's
          OpenCL runtime builds: the kernel-resource-usage remarks give VGPRs, SGPRs, spills,
          scratch and LDS
  Intel   ocloc (intel-opencl-icd), with IGC's shader dumps: GRF count, SIMD width, spill size; the
          SLM from the kernel's local arrays in IGC's LLVM IR
  NVIDIA  clang-15 for nvptx64 with libclc's OpenCL builtins (libclc-15), then ptxas -v for the
          profile's sm_XX: registers, spill stores, stack, shared memory

Occupancy (waves per SIMD, hardware threads per EU, warps per SM) is computed from the registers,
the local memory and the launched work-group size with the architecture's limits in the profile.

The tool writes vendor-report.md and vendor-report.json to --out and exits non-zero when a
compiler fails or crashes, or when a kernel that the library launches on a profile spills or uses
more local memory than the profile has, unless tools/vendor/allowances.json names that kernel,
profile and count with a reason. A compiler that is not installed is reported as skipped with
the package that provides it, never as passed; with no compiler at all the exit code is 77.

By default one profile per vendor runs (mi300x, arc-a770, h100): every kernel the library selects
there; --full runs every profile.

A compile that succeeded is kept in a result cache (--reuse DIR, default CLMLA_VENDOR_CACHE, else
$XDG_CACHE_HOME/clmla-vendor-build or ~/.cache/clmla-vendor-build; "off" keeps none), keyed by the
vendor, the target, the program's exact source and options, and the toolchain: each tool's path,
size and modification time, and the package versions the report names. A program whose key is
there is not compiled again: its registers, spills and local memory are read back and judged as a
new compile's would be. A failed compile is never kept, so it runs again every time.
"""

import argparse
import concurrent.futures
import glob
import hashlib
import json
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROFILE_DIR = os.path.join(ROOT, "tools", "vendor", "profiles")
ALLOWANCES = os.path.join(ROOT, "tools", "vendor", "allowances.json")
SUBSET = ["mi300x", "arc-a770", "h100"]
SKIP = 77

PACKAGES = {
    "amd": "clang-15 and rocm-device-libs (Debian)",
    "intel": "intel-opencl-icd (Debian: ocloc)",
    "nvidia": "clang-15 and libclc-15 (Debian), and ptxas: the CUDA toolkit or PyPI's nvidia-cuda-nvcc",
}


class ProfileError(Exception):
    pass


def need(obj, key, where, kind):
    """The field, or ProfileError naming it."""
    if not isinstance(obj, dict) or key not in obj:
        raise ProfileError("field %s.%s is missing" % (where, key))
    v = obj[key]
    ok = (isinstance(v, str) and v) if kind is str else (
        isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0) if kind is int else isinstance(v, kind)
    if not ok:
        raise ProfileError("field %s.%s must be %s" % (where, key, {
            str: "a non-empty string", int: "a number above zero", bool: "true or false"}.get(kind, str(kind))))
    return v


ARCH_FIELDS = {
    "amd": ["wave_size", "simds_per_cu", "vgprs_per_simd", "vgpr_granule", "max_waves_per_simd", "lds_per_cu",
            "max_groups_per_cu"],
    "intel": ["eus_per_core", "threads_per_eu", "threads_per_eu_large_grf", "slm_per_core"],
    "nvidia": ["warp_size", "registers_per_sm", "register_unit_per_warp", "max_warps_per_sm", "max_blocks_per_sm",
               "shared_per_sm"],
}


def load_profile(path):
    """The profile's JSON with its compiler and architecture sections checked (the device section is
    checked by the driver's own reader, through `clmla kernels`)."""
    try:
        with open(path) as f:
            p = json.load(f)
    except (OSError, ValueError) as e:
        raise ProfileError("cannot read: %s" % e)
    need(p, "profile", "", str)
    need(p, "source", "", str)
    comp = need(p, "compiler", "", dict)
    vendor = need(comp, "vendor", "compiler", str)
    if vendor not in ARCH_FIELDS:
        raise ProfileError("field compiler.vendor must be amd, intel or nvidia")
    need(comp, "target", "compiler", str)
    arch = need(p, "architecture", "", dict)
    for k in ARCH_FIELDS[vendor]:
        need(arch, k, "architecture", int)
    dev = need(p, "device", "", dict)
    local = dev.get("local_mem_bytes")
    if not isinstance(local, int) or local <= 0:
        raise ProfileError("field device.local_mem_bytes must be a number above zero")
    if vendor == "amd" and local > arch["lds_per_cu"]:
        raise ProfileError("field device.local_mem_bytes is more than architecture.lds_per_cu")
    return p


# ---- the compilers -----------------------------------------------------------------------------

def run(cmd, env=None, cwd=None, timeout=600):
    t0 = time.time()
    try:
        r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd=cwd, timeout=timeout)
        out, err, rc = r.stdout.decode(errors="replace"), r.stderr.decode(errors="replace"), r.returncode
    except subprocess.TimeoutExpired:
        out, err, rc = "", "timed out after %d s" % timeout, -1
    return rc, out, err, time.time() - t0


def first_line(text):
    for line in text.splitlines():
        if line.strip():
            return line.strip()
    return ""


def find_ptxas():
    for c in [os.environ.get("PTXAS"), shutil.which("ptxas"), "/usr/local/cuda/bin/ptxas"]:
        if c and os.access(c, os.X_OK):
            return c
    for site in sys.path:  # PyPI's nvidia-cuda-nvcc (nvidia/cuda_nvcc before CUDA 13, nvidia/cu13 after)
        for c in glob.glob(os.path.join(site, "nvidia", "*", "bin", "ptxas")):
            if os.access(c, os.X_OK):
                return c
    return None


def find_amd_libs():
    for d in ["/usr/lib/x86_64-linux-gnu/amdgcn/bitcode", "/usr/lib/amdgcn/bitcode", "/opt/rocm/amdgcn/bitcode"]:
        if os.path.exists(os.path.join(d, "ocml.bc")):
            return d
    return None


def toolchains():
    """What is installed, per vendor: a dict with the tools and versions, or a 'skipped' reason."""
    clang = shutil.which("clang-15")
    t = {}
    libs = find_amd_libs()
    if clang and libs:
        t["amd"] = {"clang": clang, "libs": libs, "version": first_line(run([clang, "--version"])[1]),
                    "libs_version": dpkg_version("rocm-device-libs")}
    else:
        t["amd"] = {"skipped": "skipped (package %s)" % PACKAGES["amd"]}
    ocloc = shutil.which("ocloc")
    if ocloc:
        t["intel"] = {"ocloc": ocloc, "version": "ocloc of intel-opencl-icd %s, IGC %s" % (
            dpkg_version("intel-opencl-icd"), dpkg_version("libigc1"))}
    else:
        t["intel"] = {"skipped": "skipped (package %s)" % PACKAGES["intel"]}
    ptxas = find_ptxas()
    libclc = "/usr/lib/clc/nvptx64--nvidiacl.bc"
    if clang and ptxas and os.path.exists(libclc):
        pv = run([ptxas, "--version"])[1].strip().splitlines()
        t["nvidia"] = {"clang": clang, "ptxas": ptxas, "libclc": libclc,
                       "version": "%s; libclc %s; ptxas %s" % (first_line(run([clang, "--version"])[1]),
                                                             dpkg_version("libclc-15"), pv[-1] if pv else "?")}
    else:
        t["nvidia"] = {"skipped": "skipped (package %s)" % PACKAGES["nvidia"]}
    return t


def dpkg_version(pkg):
    rc, out, _, _ = run(["dpkg-query", "-W", "-f=${Version}", pkg])
    return out.strip() if rc == 0 and out.strip() else "?"


def amd_compile(tc, target, src, options, work):
    """clang as ROCm's OpenCL runtime compiles (comgr): OpenCL C 1.2, the default header, -O3, and
    the device libraries linked by the driver (opencl, ocml, ockl, oclc_*: wave size, ISA, denormal
    and math flags from the options)."""
    s = os.path.join(work, "out.s")
    cmd = [tc["clang"], "-x", "cl", "-cl-std=CL1.2", "-Xclang", "-finclude-default-header", "-target",
           "amdgcn-amd-amdhsa", "-mcpu=" + target, "--rocm-device-lib-path=" + tc["libs"], "-O3", "-S", "-o", s,
           "-Rpass-analysis=kernel-resource-usage", src] + options.split()
    rc, out, err, secs = run(cmd)
    kernels = {}
    cur = None
    for line in err.splitlines():
        m = re.search(r"remark: Function Name: (\w+)", line)
        if m:
            cur = kernels.setdefault(m.group(1), {})
            continue
        m = re.search(r"remark:\s+([A-Za-z ]+?)(?: \[[^\]]*\])?: (\d+) \[-Rpass", line)
        if m and cur is not None:
            cur[m.group(1).strip()] = int(m.group(2))
    res = {}
    for name, r in kernels.items():
        res[name] = {"vgprs": r.get("VGPRs", 0), "agprs": r.get("AGPRs", 0), "sgprs": r.get("SGPRs", 0),
                     "spill": r.get("VGPRs Spill", 0) + r.get("SGPRs Spill", 0), "spill_unit": "registers",
                     "scratch": r.get("ScratchSize", 0), "local": r.get("LDS Size", 0),
                     "compiler_occupancy": r.get("Occupancy")}
    return rc, cmd, err, secs, res


def intel_compile(tc, target, src, options, work):
    """ocloc as the compute runtime builds (its default GRF mode and SIMD choice), with IGC's shader
    dumps read for each kernel's final compile."""
    dump = os.path.join(work, "dump")
    env = dict(os.environ, IGC_ShaderDumpEnable="1", IGC_DumpToCustomDir=dump)
    cmd = [tc["ocloc"], "compile", "-file", src, "-device", target, "-out_dir", os.path.join(work, "bin")]
    if options.strip():
        cmd += ["-options", options.strip()]
    rc, out, err, secs = run(cmd, env=env)
    text = out + err
    if "Build failed" in text or "error:" in text:
        rc = rc or 1
    warned = {}
    for m in re.finditer(r"kernel (\w+)\s+compiled SIMD(\d+) allocated (\d+) regs and spilled around (\d+)", text):
        warned[m.group(1)] = (int(m.group(2)), int(m.group(3)), int(m.group(4)))
    # the kernels' asm: OCL_asm<hash>_[<retry>_]simd<W>_entry_<n>.asm; the last retry is the one kept
    found = {}
    for path in glob.glob(os.path.join(dump, "*.asm")):
        m = re.search(r"_(?:(\d+)_)?simd(\d+)_entry_\d+\.asm$", path)
        if not m:
            continue
        with open(path, errors="replace") as f:
            head = f.read(4096)
        k = re.search(r"^//\.kernel (\w+)", head, re.M)
        if not k:
            continue
        g = re.search(r"numGRF=(\d+)", head)
        sp = re.search(r"^//\.spill size (\d+)", head, re.M)
        rank = (int(m.group(1) or 0), int(m.group(2)))
        if k.group(1) not in found or rank > found[k.group(1)][0]:
            found[k.group(1)] = (rank, int(g.group(1)) if g else 0, int(sp.group(1)) if sp else 0)
    slm = {}
    for path in glob.glob(os.path.join(dump, "*_optimized.ll")):
        with open(path, errors="replace") as f:
            for line in f:
                m = re.match(r"@(\w+)\.\w+ = .*addrspace\(3\) global \[(\d+) x (<(\d+) x )?(\w+)>?\]", line)
                if m:
                    elem = {"float": 4, "i32": 4, "half": 2, "i16": 2, "i8": 1, "double": 8, "i64": 8}.get(m.group(5), 4)
                    slm[m.group(1)] = slm.get(m.group(1), 0) + int(m.group(2)) * int(m.group(4) or 1) * elem
    res = {}
    for name, (rank, grf, spill) in found.items():
        simd = rank[1]
        if name in warned:
            simd, grf = warned[name][0], warned[name][1]
            spill = max(spill, 1)
        res[name] = {"grf": grf, "simd": simd, "spill": spill, "spill_unit": "bytes", "local": slm.get(name, 0),
                     "spilled_grfs_reported": warned.get(name, (0, 0, 0))[2]}
    return rc, cmd, text, secs, res


def nvidia_compile(tc, target, src, options, work):
    """clang's NVPTX back end for OpenCL C 1.2 with libclc's builtins, as PTX for the newest
    architecture clang 15 knows up to the target (sm_86), then ptxas for the profile's sm_XX, as
    NVIDIA's driver assembles a program's PTX for the device."""
    sm = int(target.split("_")[1])
    ptx = os.path.join(work, "out.ptx")
    cmd = [tc["clang"], "-x", "cl", "-cl-std=CL1.2", "-Xclang", "-finclude-default-header", "-target",
           "nvptx64-nvidia-nvcl", "-march=sm_%d" % min(sm, 86), "-Xclang", "-mlink-builtin-bitcode", "-Xclang",
           tc["libclc"], "-Wno-linker-warnings", "-O3", "-S", "-o", ptx, src] + options.split()
    rc, out, err, secs = run(cmd)
    if rc != 0:
        return rc, cmd, err, secs, {}
    cmd2 = [tc["ptxas"], "-v", "-arch=" + target, ptx, "-o", os.path.join(work, "out.cubin")]
    rc, out2, err2, secs2 = run(cmd2)
    res = {}
    cur = None
    for line in (out2 + err2).splitlines():
        m = re.search(r"Function properties for (\w+)", line)
        if m:
            cur = res.setdefault(m.group(1), {"spill_unit": "bytes"})
            continue
        if cur is None:
            continue
        m = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", line)
        if m:
            cur.update(stack=int(m.group(1)), spill=int(m.group(2)), spill_loads=int(m.group(3)))
        m = re.search(r"Used (\d+) registers", line)
        if m:
            cur["registers"] = int(m.group(1))
            sm_ = re.search(r"(\d+) bytes smem", line)
            cur["local"] = int(sm_.group(1)) if sm_ else 0
    # only entry functions (kernels) report registers
    res = {k: v for k, v in res.items() if "registers" in v}
    return rc, cmd + ["&&"] + cmd2, err + out2 + err2, secs + secs2, res


COMPILE = {"amd": amd_compile, "intel": intel_compile, "nvidia": nvidia_compile}


# ---- the result cache --------------------------------------------------------------------------

CACHE_FORMAT = 1


def default_cache_dir():
    env = os.environ.get("CLMLA_VENDOR_CACHE")
    if env:
        return env
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "clmla-vendor-build")


def toolchain_identity(tc):
    """What names a vendor's toolchain in the cache key: its entries (paths and the versions that
    dpkg and the tools report) and, for each path among them, its size and modification time (for a
    folder, those of the files in it)."""
    ident = []
    for k in sorted(tc):
        v = tc[k]
        ident.append([k, v])
        if not isinstance(v, str) or not os.path.isabs(v):
            continue
        files = sorted(glob.glob(os.path.join(v, "*"))) if os.path.isdir(v) else [v]
        for f in files:
            try:
                st = os.stat(f)
                ident.append([f, st.st_size, st.st_mtime_ns])
            except OSError:
                ident.append([f, None])
    return ident


def cache_key(vendor, identity, target, src, options):
    with open(src, "rb") as f:
        source = f.read()
    h = hashlib.sha256()
    h.update(json.dumps([CACHE_FORMAT, vendor, target, options, identity]).encode())
    h.update(source)
    return h.hexdigest()


def cache_load(cache_dir, key):
    """The kept (cmd, secs, res) of a key, or None where there is none or it does not read back."""
    if not cache_dir:
        return None
    try:
        with open(os.path.join(cache_dir, key + ".json")) as f:
            d = json.load(f)
        if d.get("format") != CACHE_FORMAT or not isinstance(d.get("res"), dict):
            return None
        return d["cmd"], float(d["secs"]), d["res"]
    except (OSError, ValueError, KeyError, TypeError):
        return None


def cache_store(cache_dir, key, cmd, secs, res):
    """Keeps a successful compile's result; written to a temporary name and renamed, so that a reader
    never sees half a file. A cache that cannot be written is left alone."""
    if not cache_dir:
        return
    try:
        os.makedirs(cache_dir, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=cache_dir, suffix=".tmp")
        with os.fdopen(fd, "w") as f:
            json.dump({"format": CACHE_FORMAT, "cmd": cmd, "secs": secs, "res": res}, f)
        os.replace(tmp, os.path.join(cache_dir, key + ".json"))
    except OSError:
        pass


# ---- occupancy ---------------------------------------------------------------------------------

def align(x, a):
    return (x + a - 1) // a * a


def occupancy(vendor, arch, k, items):
    """(value, unit text, limiting resource) for kernel result k launched with `items` per group."""
    if vendor == "amd":
        wave = arch["wave_size"]
        wpg = max(1, math.ceil(items / wave))
        total = align(k["vgprs"], 4) + k["agprs"] if arch.get("unified_agprs") else max(k["vgprs"], k["agprs"])
        by_vgpr = min(arch["max_waves_per_simd"], arch["vgprs_per_simd"] // align(max(total, 1), arch["vgpr_granule"]))
        limits = {"registers": arch["simds_per_cu"] * by_vgpr // wpg}
        if wpg > 1:  # groups of one wave take no barrier slot
            limits["groups"] = arch["max_groups_per_cu"]
        if arch.get("sgprs_per_simd"):
            by_sgpr = arch["sgprs_per_simd"] // align(max(k["sgprs"], 1), arch.get("sgpr_granule", 16))
            limits["sgprs"] = arch["simds_per_cu"] * min(by_sgpr, arch["max_waves_per_simd"]) // wpg
        if k["local"]:
            limits["LDS"] = arch["lds_per_cu"] // k["local"]
        why = min(limits, key=lambda n: limits[n])
        groups = limits[why]
        return round(groups * wpg / arch["simds_per_cu"], 2), "waves/SIMD of %d" % arch["max_waves_per_simd"], why, groups
    if vendor == "intel":
        tpe = arch["threads_per_eu"] if k["grf"] <= 128 else arch["threads_per_eu_large_grf"]
        tpg = max(1, math.ceil(items / max(k["simd"], 1)))
        limits = {"threads": arch["eus_per_core"] * tpe // tpg}
        if k["local"]:
            limits["SLM"] = arch["slm_per_core"] // k["local"]
        why = min(limits, key=lambda n: limits[n])
        groups = limits[why]
        return round(groups * tpg / arch["eus_per_core"], 2), "threads/EU of %d" % tpe, why, groups
    warps = max(1, math.ceil(items / arch["warp_size"]))
    per_warp = align(max(k["registers"], 1) * arch["warp_size"], arch["register_unit_per_warp"])
    limits = {"registers": (arch["registers_per_sm"] // per_warp) // warps,
              "warps": arch["max_warps_per_sm"] // warps, "blocks": arch["max_blocks_per_sm"]}
    limits["shared"] = arch["shared_per_sm"] // (k["local"] + arch.get("shared_reserved_per_block", 0))
    why = min(limits, key=lambda n: limits[n])
    groups = limits[why]
    return groups * warps, "warps/SM of %d" % arch["max_warps_per_sm"], why, groups


def registers_text(vendor, k):
    if vendor == "amd":
        return "%d V%s / %d S" % (k["vgprs"], " + %d A" % k["agprs"] if k["agprs"] else "", k["sgprs"])
    if vendor == "intel":
        return "%d GRF, SIMD%d" % (k["grf"], k["simd"])
    return "%d" % k["registers"]


# ---- the library's selection -------------------------------------------------------------------

def plan(clmla, profile_path, record, presets, dtypes, weights):
    """Runs `clmla kernels`; returns its lines and the record: programs {(hash, options): info}."""
    env = dict(os.environ)
    for v in ["CLMLA_KERNEL_TUNING", "CLMLA_ATTENTION_KERNELS", "CLMLA_PRODUCT_KERNELS", "CLMLA_KERNEL_DIR"]:
        env.pop(v, None)  # the library's defaults and built-in tables, not this machine's settings
    cmd = [clmla, "kernels", "--profile", profile_path, "--record", record, "--preset", presets, "--cache-dtype",
           dtypes, "--weights-dtype", weights]
    rc, out, err, secs = run(cmd, env=env)
    if rc != 0:
        raise ProfileError("clmla kernels failed (exit %d): %s" % (rc, err.strip()))
    lines = [l.split("\t") for l in out.splitlines() if l.strip()]
    return lines, secs


def read_record(record, lines):
    """The driver's record: programs {(hash, options): info}. A program of clmla's is the prelude,
    "#line 1", then the file (program.c); the library logs its builds in the order the driver
    records them, so the n-th such build is the n-th line `clmla kernels` printed, which names the
    file. Other programs (CLBlast's) are counted only."""
    programs, order = {}, []
    with open(os.path.join(record, "record.tsv")) as f:
        for line in f:
            parts = line.rstrip("\n").split("\t")
            kind, h, opts = parts[0], parts[1], parts[2]
            p = programs.setdefault((h, opts), {"hash": h, "options": opts, "created": set(), "launched": {},
                                                "file": None, "source": os.path.join(record, "src", h + ".cl")})
            if kind == "build":
                order.append(p)
            elif kind == "kernel":
                p["created"].add(parts[3])
            elif kind == "launch":
                p["launched"].setdefault(parts[3], set()).add(parts[4])
    ours = []
    for p in order:
        with open(p["source"], "rb") as f:
            if b"\n#line 1\n" in f.read():
                ours.append(p)
    mismatch = len(ours) != len(lines)
    for p, l in zip(ours, lines):
        mismatch |= p["options"] != l[3]
        p["file"] = l[2]
    return programs, mismatch


# ---- the run -----------------------------------------------------------------------------------

def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--clmla", default=os.path.join(ROOT, "build", "clmla"), help="the clmla command (built with "
                    "the target clmla_profile_icd beside it)")
    ap.add_argument("--out", default="vendor-report", help="folder for vendor-report.md / .json (default ./vendor-report)")
    ap.add_argument("--full", action="store_true", help="every profile (default: %s)" % ", ".join(SUBSET))
    ap.add_argument("--profile", action="append", help="a profile name or file (repeatable); overrides --full")
    ap.add_argument("--preset", default="v2-lite,v2,v3,kimi-k2")
    ap.add_argument("--cache-dtype", default="f32,f16,bf16,fp8")
    ap.add_argument("--weights-dtype", default="f32")
    ap.add_argument("--allowances", default=ALLOWANCES)
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--keep", action="store_true", help="keep the compilers' outputs under --out/work")
    ap.add_argument("--reuse", default=default_cache_dir(), help="folder of kept compile results, or 'off' "
                    "(default: CLMLA_VENDOR_CACHE, else ~/.cache/clmla-vendor-build)")
    args = ap.parse_args()
    t_start = time.time()

    if args.profile:
        paths = [p if os.path.exists(p) else os.path.join(PROFILE_DIR, p + ".json") for p in args.profile]
    elif args.full:
        paths = sorted(glob.glob(os.path.join(PROFILE_DIR, "*.json")))
    else:
        paths = [os.path.join(PROFILE_DIR, p + ".json") for p in SUBSET]
    if not os.access(args.clmla, os.X_OK):
        print("vendor_build: %s is not there (build clmla first, or pass --clmla)" % args.clmla, file=sys.stderr)
        return 2
    try:
        with open(args.allowances) as f:
            allowances = json.load(f).get("allowances", [])
    except OSError:
        allowances = []
    except ValueError as e:
        print("vendor_build: %s: %s" % (args.allowances, e), file=sys.stderr)
        return 2
    for i, a in enumerate(allowances):
        for key in ["kernel", "profile", "count", "reason"]:
            if key not in a:
                print("vendor_build: %s: allowance %d has no field %s" % (args.allowances, i, key), file=sys.stderr)
                return 2

    loaded = []
    for path in paths:
        try:
            loaded.append((path, load_profile(path)))
        except ProfileError as e:
            print("vendor_build: profile %s refused: %s" % (path, e), file=sys.stderr)
            return 2
    tc = toolchains()
    if all("skipped" in t for t in tc.values()):
        for v, t in tc.items():
            print("vendor_build: %s: %s" % (v, t["skipped"]))
        return SKIP
    os.makedirs(args.out, exist_ok=True)
    work_root = os.path.join(os.path.abspath(args.out), "work") if args.keep else tempfile.mkdtemp(prefix="vendor-")

    profiles, jobs, problems = [], [], []
    for path, prof in loaded:
        key = prof["profile"]
        vendor = prof["compiler"]["vendor"]
        record = os.path.join(work_root, "record", key)
        shutil.rmtree(record, ignore_errors=True)
        try:
            lines, plan_secs = plan(args.clmla, path, record, args.preset, args.cache_dtype, args.weights_dtype)
        except ProfileError as e:
            print("vendor_build: profile %s: %s" % (path, e), file=sys.stderr)
            return 2
        programs, mismatch = read_record(record, lines)
        ours = {k: p for k, p in programs.items() if p["file"]}
        if mismatch:  # the library's log and the driver's record must name the same builds
            problems.append("%s: the library's build log and the driver's record differ" % key)
        uses = {}
        for l in lines:
            uses.setdefault((l[2], l[3]), set()).add("%s/%s" % (l[0], l[1]))
        entry = {"profile": key, "file": os.path.relpath(path, ROOT), "description": prof.get("description", ""),
                 "vendor": vendor, "target": prof["compiler"]["target"], "device": prof["device"]["name"],
                 "local_mem_bytes": prof["device"]["local_mem_bytes"], "plan_seconds": round(plan_secs, 2),
                 "programs": len(ours), "other_programs": len(programs) - len(ours), "kernels": [],
                 "status": tc[vendor].get("skipped", "compiled")}
        profiles.append((entry, prof))
        if "skipped" in tc[vendor]:
            continue
        for (h, opts), p in sorted(ours.items(), key=lambda kv: (kv[1]["file"], kv[1]["options"])):
            work = os.path.join(work_root, key, "%s-%s-%d" % (p["file"][:-3], h[:8], len(jobs)))
            os.makedirs(work, exist_ok=True)
            jobs.append((entry, prof, p, work, sorted(uses.get((p["file"], opts), []))))

    cache_dir = None if args.reuse in ("", "off") else args.reuse
    identities = {v: toolchain_identity(t) for v, t in tc.items() if cache_dir and "skipped" not in t}
    reused = []

    def compile_one(job):
        entry, prof, p, work, used = job
        vendor, target = prof["compiler"]["vendor"], prof["compiler"]["target"]
        key = cache_key(vendor, identities[vendor], target, p["source"], p["options"]) if cache_dir else None
        kept = cache_load(cache_dir, key) if key else None
        if kept:
            reused.append(key)
            cmd, secs, res = kept
            return 0, cmd, "", secs, res
        rc, cmd, log, secs, res = COMPILE[vendor](tc[vendor], target, p["source"], p["options"], work)
        if rc == 0 and key:
            cache_store(cache_dir, key, cmd, secs, res)
        return rc, cmd, log, secs, res

    failures, violations, notes = [], [], []
    used_allowances = set()
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        results = list(pool.map(compile_one, jobs))
    for (entry, prof, p, work, used), (rc, cmd, log, secs, res) in zip(jobs, results):
        vendor = prof["compiler"]["vendor"]
        arch = prof["architecture"]
        if rc != 0:
            failures.append("%s: %s.cl [%s]: %s exited %d:\n%s" % (
                entry["profile"], p["file"][:-3], p["options"], os.path.basename(cmd[0]), rc,
                "\n".join(log.strip().splitlines()[-15:])))
            continue
        for name in sorted(set(p["created"]) | set(p["launched"])):
            if name not in res:
                failures.append("%s: %s.cl [%s]: the compiler reported nothing for kernel %s" % (
                    entry["profile"], p["file"], p["options"], name))
                continue
            k = dict(res[name])
            shapes = sorted(p["launched"].get(name, []))
            row = {"kernel": name, "file": p["file"], "options": p["options"], "used_by": used,
                   "launched": shapes, "registers": registers_text(vendor, k), "result": k,
                   "compile_seconds": round(secs, 2)}
            items = max([eval_items(s) for s in shapes] or [0])
            if items:
                occ, unit, why, groups = occupancy(vendor, arch, k, items)
                row.update(occupancy=occ, occupancy_unit=unit, occupancy_limit=why, groups_per_unit=groups,
                           items=items)
                if groups < 1:
                    violations.append("%s: %s [%s]: a work-group of %d items does not fit (%s)" % (
                        entry["profile"], name, p["options"], items, why))
            if not shapes:
                notes.append("%s: %s [%s] created but not launched" % (entry["profile"], name, p["options"]))
            # what the profile's device would refuse or pay for
            spill = k.get("spill", 0)
            over = k.get("local", 0) > entry["local_mem_bytes"]
            if spill or over:
                what = ("spills %d %s" % (spill, k["spill_unit"]) if spill else "") + (
                    "%suses %d bytes of local memory, the device has %d" % (
                        "; " if spill else "", k["local"], entry["local_mem_bytes"]) if over else "")
                allowed = None
                for i, a in enumerate(allowances):
                    if a["kernel"] == name and a["profile"] == entry["profile"] and spill <= a["count"] and not over \
                            and a.get("options", "") in p["options"]:
                        allowed = i
                        break
                if allowed is None:
                    violations.append("%s: %s [%s] %s" % (entry["profile"], name, p["options"], what))
                else:
                    used_allowances.add(allowed)
                    row["allowance"] = allowances[allowed]["reason"]
            entry["kernels"].append(row)

    for i, a in enumerate(allowances):
        if i not in used_allowances and any(e["profile"] == a["profile"] and e["status"] == "compiled"
                                            for e, _ in profiles):
            notes.append("allowance %d (%s on %s) was not needed" % (i, a["kernel"], a["profile"]))
    if work_root != os.path.join(os.path.abspath(args.out), "work"):
        shutil.rmtree(work_root, ignore_errors=True)

    wall = time.time() - t_start
    report = {"compilers": {v: t.get("version", t.get("skipped")) for v, t in tc.items()},
              "profiles": [e for e, _ in profiles], "failures": failures, "violations": violations,
              "problems": problems, "notes": notes, "wall_seconds": round(wall, 1), "jobs": args.jobs,
              "compiled": len(jobs) - len(reused), "reused": len(reused), "cache": cache_dir or "off",
              "subset": not args.full and not args.profile}
    with open(os.path.join(args.out, "vendor-report.json"), "w") as f:
        json.dump(report, f, indent=1, default=sorted)
    md = markdown(report)
    with open(os.path.join(args.out, "vendor-report.md"), "w") as f:
        f.write(md)
    print(md)
    for v, t in tc.items():
        if "skipped" in t:
            print("vendor_build: %s: %s" % (v, t["skipped"]))
    bad = failures + violations + problems
    for b in bad:
        print("vendor_build: FAILED: " + b, file=sys.stderr)
    print("vendor_build: %d programs on %d profiles (%d compiled, %d results reused from %s) in %.0f s; "
          "%d failures, %d violations" % (
              len(jobs), sum(1 for e, _ in profiles if e["status"] == "compiled"), len(jobs) - len(reused),
              len(reused), cache_dir or "no cache", wall, len(failures), len(violations) + len(problems)))
    return 1 if bad else 0


def eval_items(shape):
    if shape == "auto":
        return 0
    n = 1
    for d in shape.split("x"):
        n *= int(d)
    return n


def markdown(r):
    out = ["# clmla's kernels as each vendor's compiler builds them", ""]
    out.append("Written by tools/vendor_build.py in %.0f s with %d jobs (%s): %d programs compiled, %d results "
               "reused from earlier compiles of the same source, options and toolchain." % (
                   r["wall_seconds"], r["jobs"], "one profile per vendor" if r["subset"] else "the profiles asked for",
                   r["compiled"], r["reused"]))
    out += ["", "## Compilers", "", "| vendor | compiler |", "| --- | --- |"]
    for v, c in r["compilers"].items():
        out.append("| %s | %s |" % (v, c))
    out += ["", "## Profiles", "", "| profile | device | target | programs | kernels | spilling | status |",
            "| --- | --- | --- | ---: | ---: | ---: | --- |"]
    for e in r["profiles"]:
        spilling = sum(1 for k in e["kernels"] if k["result"].get("spill"))
        out.append("| %s | %s | %s | %d | %d | %d | %s |" % (e["profile"], e["device"], e["target"], e["programs"],
                                                           len(e["kernels"]), spilling, e["status"]))
    out += ["", "## Kernels", "",
            "Per profile and kernel, over the build variants the presets select (variants: how many "
            "option sets): registers, spills, local memory per work-group and occupancy at the launched "
            "work-group size, each as the worst variant has it, and what limits the occupancy.", ""]
    for e in r["profiles"]:
        if not e["kernels"]:
            continue
        out += ["### %s (%s, %s)" % (e["profile"], e["device"], e["target"]), "",
                "| kernel | variants | registers | spill | local bytes | items | occupancy | limited by |",
                "| --- | ---: | --- | ---: | ---: | ---: | --- | --- |"]
        by = {}
        for k in e["kernels"]:
            by.setdefault(k["kernel"], []).append(k)
        for name in sorted(by):
            ks = by[name]
            worst = max(ks, key=lambda k: (k["result"].get("spill", 0), -k.get("occupancy", 1e9), k["result"].get("local", 0)))
            spill = max(k["result"].get("spill", 0) for k in ks)
            local = max(k["result"].get("local", 0) for k in ks)
            regs = sorted({k["registers"] for k in ks})
            reg_text = regs[0] if len(regs) == 1 else "%s .. %s" % (regs[0], regs[-1])
            occ = [k for k in ks if "occupancy" in k]
            occ_text = "%s %s" % (min(k["occupancy"] for k in occ), worst.get("occupancy_unit", "")) if occ else "-"
            llvm = sorted({k["result"]["compiler_occupancy"] for k in ks if k["result"].get("compiler_occupancy")})
            if llvm:  # LLVM's own figure, which assumes the LDS of a group spread over every SIMD
                occ_text += " (LLVM: %s)" % "/".join(str(x) for x in llvm)
            out.append("| %s | %d | %s | %s | %d | %s | %s | %s |" % (
                name, len(ks), reg_text, "%d %s" % (spill, worst["result"]["spill_unit"]) if spill else "0", local,
                worst.get("items", "-"), occ_text, worst.get("occupancy_limit", "-")))
        out.append("")
    for title, key in [("Failures", "failures"), ("Violations", "violations"), ("Problems", "problems")]:
        if r[key]:
            out += ["## " + title, ""] + ["- " + x.replace("\n", "\n  ") for x in r[key]] + [""]
    allowed = [(e["profile"], k) for e in r["profiles"] for k in e["kernels"] if "allowance" in k]
    if allowed:
        out += ["## Allowed (tools/vendor/allowances.json)", ""]
        for prof, k in allowed:
            out.append("- %s: %s [%s]: %d %s: %s" % (prof, k["kernel"], k["options"], k["result"]["spill"],
                                                    k["result"]["spill_unit"], k["allowance"]))
        out.append("")
    return "\n".join(out)


if __name__ == "__main__":
    sys.exit(main())
