#!/bin/sh
# cl/attn_latent_mma.cl as NVIDIA devices build it (CLMLA_PTX_MMA: mma.sync in inline PTX), compiled
# to PTX by the host's clang (target nvptx64-nvidia-nvcl, the triple of NVIDIA's OpenCL) and
# assembled by ptxas for sm_80 and sm_90, over bf16, fp8, f16 and f32 caches at DeepSeek's row (512 + 64, 16
# heads) and MiniCPM3's (256 + 32, 3 heads), dense, sparse (SPARSE) and folded (FOLD): the inline
# assembly must be PTX that ptxas takes, the kernel must issue its
# mma instructions and spill nothing. Nothing runs: this checks what can be checked without a GPU
# (the device's own compiler is NVIDIA's, not clang; register counts are printed, not judged).
# OpenCL built-ins that clang leaves external are defined for the check by
# tests/fixtures/ptx/builtins_stub.cl. Skipped (77) without clang's NVPTX target or ptxas
# (PTXAS names it; the CUDA toolkit's, or pip's nvidia-cuda-nvcc).
#   sh tests/ptx_mma.sh CL_DIR
set -u
dir=${1:?usage: ptx_mma.sh CL_DIR}
clang=${CLANG:-clang}
ptxas=${PTXAS:-ptxas}
root=$(cd "$(dirname "$0")" && pwd)
command -v "$ptxas" >/dev/null 2>&1 || { echo "skipped: no ptxas (set PTXAS)"; exit 77; }
tmp=$(mktemp -d) || exit 1
trap 'rm -rf "$tmp"' EXIT
cat "$root/fixtures/ptx/builtins_stub.cl" "$dir/prelude.cl" "$dir/attn_latent_mma.cl" >"$tmp/k.cl"
printf '__kernel void k(__global float *x) { x[0] = 1.0f; }\n' >"$tmp/probe.cl"
if ! "$clang" -x cl -cl-std=CL1.2 -Xclang -finclude-default-header -target nvptx64-nvidia-nvcl -S \
        -o "$tmp/probe.ptx" "$tmp/probe.cl" 2>/dev/null; then
    echo "skipped: $clang has no NVPTX target"
    exit 77
fi
fail=0
for shape in "-D CACHE_BF16 -D RKV=512 -D DR=64 -D HG=16" "-D CACHE_BF16 -D RKV=256 -D DR=32 -D HG=3" \
             "-D CACHE_FP8 -D RKV=512 -D DR=64 -D HG=16" "-D CACHE_FP8 -D RKV=256 -D DR=32 -D HG=3" \
             "-D RKV=512 -D DR=64 -D HG=16" "-D RKV=256 -D DR=32 -D HG=3" \
             "-D CACHE_FP8 -D RKV=512 -D DR=64 -D HG=16 -D SPARSE" "-D CACHE_BF16 -D RKV=512 -D DR=64 -D HG=16 -D SPARSE" \
             "-D CACHE_FP8 -D RKV=512 -D DR=64 -D HG=16 -D HT=8 -D FOLD=2" "-D RKV=512 -D DR=64 -D HG=12 -D HT=3 -D FOLD=4" \
             "-D CACHE_F16 -D RKV=512 -D DR=64 -D HG=16" "-D CACHE_F16 -D RKV=256 -D DR=32 -D HG=3"; do
    # one PTX per shape (clang's target CPU is sm_80 for both), assembled by ptxas for each sm
    # shellcheck disable=SC2086
    if ! "$clang" -x cl -cl-std=CL1.2 -Xclang -cl-ext=+cl_khr_fp16 -Xclang -finclude-default-header \
            -target nvptx64-nvidia-nvcl -Xclang -target-cpu -Xclang sm_80 -O2 -D CLMLA_PTX_MMA \
            $shape -S -o "$tmp/k.ptx" "$tmp/k.cl" 2>"$tmp/err"; then
        echo "FAIL [$shape]: clang:"; head -20 "$tmp/err"; fail=1; continue
    fi
    n=$(grep -c 'mma\.sync\.aligned\.m16n8k[0-9]*\.row\.col.f32\.[bt]*f[0-9]*\.[bt]*f[0-9]*\.f32' "$tmp/k.ptx")
    calls=$(grep -c 'call\.uni' "$tmp/k.ptx")
    for sm in sm_80 sm_90; do
        if ! info=$("$ptxas" -arch="$sm" -v -o "$tmp/k.cubin" "$tmp/k.ptx" 2>&1); then
            echo "FAIL [$shape] $sm: ptxas:"; echo "$info" | head -20; fail=1; continue
        fi
        line=$(echo "$info" | grep -A2 'for attn_latent_mma' | tr '\n' ' ')
        echo "[$shape] $sm: $n mma.sync, $calls calls; $line"
        [ "$n" -gt 0 ] || { echo "FAIL [$shape] $sm: no mma.sync in the PTX"; fail=1; }
        [ "$calls" = 0 ] || { echo "FAIL [$shape] $sm: $calls calls left (a built-in without a stub)"; fail=1; }
        echo "$line" | grep -q ' 0 bytes spill stores' || { echo "FAIL [$shape] $sm: spills"; fail=1; }
    done
done
exit $fail
