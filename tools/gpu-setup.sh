#!/bin/sh
# Runs clmla, built here, on a machine that has a GPU driver but none of clmla's runtime libraries:
# rented GPU machines such as the H100s of docs/perf-log.md ("GPU runs") have
# NVIDIA's driver and its OpenCL library, and no ICD loader, CLBlast or cJSON.
#
#   sh tools/gpu-setup.sh pack
#       here, on Debian: download ocl-icd-libopencl1, libclblast1 and libcjson1 and unpack them
#       into .device/root (ignored by git; carry it with the build folder)
#   sh tools/gpu-setup.sh run COMMAND [ARG...]
#       there: put .device/root's libraries on LD_LIBRARY_PATH, write an ICD file naming the
#       vendor's OpenCL library (found through ldconfig and the usual folders) into .device/icd,
#       point OCL_ICD_VENDORS at that folder alone, and run COMMAND
#
# CLMLA_ICD_LIB names the vendor library to look for; unset, the first found of NVIDIA's
# (libnvidia-opencl.so.1), AMD ROCm's (libamdocl64.so), Intel's compute runtime's (libigdrcl.so) and
# Mesa's rusticl (libRusticlOpenCL.so.1, with RUSTICL_ENABLE defaulting to radeonsi,iris, its AMD
# and Intel GPU drivers). PoCL's libpocl.so.2, named, tries the script on a CPU.
# For example, as one call of the device tool, with .device and build carried:
#   sh tools/gpu-setup.sh run sh -c 'build/clmla devices && cd build && ctest'
set -eu

here=$(cd "$(dirname "$0")/.." && pwd)
dev="$here/.device"

find_vendor_lib() {
    name=$1
    path=$(ldconfig -p 2>/dev/null | awk -v n="$name" '$1 == n { print $NF; exit }')
    if [ -n "$path" ] && [ -e "$path" ]; then
        echo "$path"
        return 0
    fi
    for d in /usr/local/nvidia/lib64 /usr/local/nvidia/lib /usr/lib/x86_64-linux-gnu /usr/lib64 /usr/lib \
             /opt/rocm/lib /opt/rocm/opencl/lib /usr/lib/x86_64-linux-gnu/intel-opencl; do
        if [ -e "$d/$name" ]; then
            echo "$d/$name"
            return 0
        fi
    done
    return 1
}

case "${1:-}" in
pack)
    command -v apt-get >/dev/null 2>&1 || { echo "gpu-setup: pack needs apt-get (Debian)" >&2; exit 1; }
    rm -rf "$dev/debs" "$dev/root"
    mkdir -p "$dev/debs" "$dev/root"
    (cd "$dev/debs" && apt-get download ocl-icd-libopencl1 libclblast1 libcjson1)
    for f in "$dev"/debs/*.deb; do
        dpkg -x "$f" "$dev/root"
    done
    rm -rf "$dev/debs"
    echo "gpu-setup: unpacked into $dev/root ($(du -sh "$dev/root" | cut -f1)):"
    ls "$dev/root/usr/lib/x86_64-linux-gnu"
    ;;
run)
    shift
    [ $# -gt 0 ] || { echo "usage: sh tools/gpu-setup.sh run COMMAND [ARG...]" >&2; exit 2; }
    libdir="$dev/root/usr/lib/x86_64-linux-gnu"
    [ -d "$libdir" ] || { echo "gpu-setup: $libdir is missing: run 'pack' here and carry .device" >&2; exit 1; }
    vendor=""
    for name in ${CLMLA_ICD_LIB:-libnvidia-opencl.so.1 libamdocl64.so libigdrcl.so libRusticlOpenCL.so.1}; do
        vendor=$(find_vendor_lib "$name") && break
        vendor=""
    done
    [ -n "$vendor" ] || {
        echo "gpu-setup: no ${CLMLA_ICD_LIB:-vendor OpenCL library (NVIDIA, AMD ROCm, Intel, Mesa rusticl)} on this" \
            "machine (ldconfig, /usr/local/nvidia, /usr/lib*, /opt/rocm)" >&2
        exit 1
    }
    case $vendor in *Rusticl*) export RUSTICL_ENABLE="${RUSTICL_ENABLE:-radeonsi,iris}" ;; esac
    rm -rf "$dev/icd"
    mkdir -p "$dev/icd"
    echo "$vendor" > "$dev/icd/vendor.icd"
    export LD_LIBRARY_PATH="$libdir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    export OCL_ICD_VENDORS="$dev/icd"
    # ctest files name the cmake they were configured with (/usr/bin/cmake on Debian); where that
    # is missing and another cmake is on PATH, link it so that the cmake -P tests can run
    if [ ! -e /usr/bin/cmake ] && command -v cmake >/dev/null 2>&1 && [ -w /usr/bin ]; then
        ln -s "$(command -v cmake)" /usr/bin/cmake
        echo "gpu-setup: linked /usr/bin/cmake to $(command -v cmake)"
    fi
    echo "gpu-setup: OpenCL vendor library $vendor"
    exec "$@"
    ;;
*)
    echo "usage: sh tools/gpu-setup.sh pack | run COMMAND [ARG...]" >&2
    exit 2
    ;;
esac
