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
# CLMLA_ICD_LIB names the vendor library to look for (default libnvidia-opencl.so.1; AMD's is
# libamdocl64.so, Intel's libigdrcl.so, PoCL's libpocl.so.2, which tries the script on a CPU).
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
             /opt/rocm/lib /opt/rocm/opencl/lib; do
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
    name=${CLMLA_ICD_LIB:-libnvidia-opencl.so.1}
    vendor=$(find_vendor_lib "$name") || {
        echo "gpu-setup: no $name on this machine (ldconfig, /usr/local/nvidia, /usr/lib*, /opt/rocm)" >&2
        exit 1
    }
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
