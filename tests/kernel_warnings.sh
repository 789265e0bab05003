#!/bin/sh
# Every kernel file, compiled as the library compiles it (cl/prelude.cl first) by the host's clang
# for OpenCL C 1.2 with -Wall -Werror, under each set of build options that selects other code: the
# weight and cache dtypes and their whole-vector loads, the CPU options, the query layout, masks, row
# slices, sparse lists, the prefill tiles. A warning here is a warning on some device's compiler
# (PoCL prints "N warnings generated" and clmla logs the build log at info level).
# Compiled to LLVM IR for an x86-64 AVX2 processor without AVX-512, as PoCL compiles on one, with
# every inline function emitted (-fgnu89-inline; PoCL's builds emit them too): a call passing or
# returning a 512-bit vector there draws clang's -Wpsabi warning, which PoCL prints at every build
# of a program that holds one (clang gives it while making the IR, so no machine code is made).
# The sets below include what the CPU kernels are built with. For each file a set first loses the
# -D of every name the file (with the prelude) never spells, since those cannot change its text;
# a set that is then one already seen, or whose preprocessed file equals an earlier set's, is not
# compiled again (the same text gives the same diagnostics). Nothing runs. Skipped (77) without a
# clang that compiles OpenCL C.
#   sh tests/kernel_warnings.sh CL_DIR
set -u
dir=${1:?usage: kernel_warnings.sh CL_DIR}
clang=${CLANG:-clang}
tmp=$(mktemp -d) || exit 1
trap 'rm -rf "$tmp"' EXIT
cl="$clang -x cl -cl-std=CL1.2 -Xclang -finclude-default-header"
target="-target x86_64-pc-linux-gnu -march=haswell -fgnu89-inline -O0 -S -emit-llvm -o /dev/null"
printf '__kernel void k(__global float *x) { x[0] = 1.0f; }\n' >"$tmp/probe.cl"
# shellcheck disable=SC2086
if ! $cl $target "$tmp/probe.cl" 2>/dev/null; then
    echo "kernel_warnings: $clang does not compile OpenCL C here; skipped"
    exit 77
fi
# One set per line; the empty line is the files' own defaults.
sets='
-D W_DTYPE=1
-D W_DTYPE=2
-D W_DTYPE=3
-D W_ALIGNED -D W_DTYPE=1
-D W_ALIGNED -D W_DTYPE=2 -D VW=8
-D W_ALIGNED -D W_DTYPE=3 -D VW=16
-D CACHE_F16
-D CACHE_BF16
-D RKV=512 -D DR=64 -D CACHE_FP8
-D CLMLA_FP8_HALF -D RKV=512 -D DR=64 -D CACHE_FP8
-D CLMLA_FP8_HALF -D W_DTYPE=3
-D CACHE_ALIGNED -D CACHE_F16
-D CACHE_ALIGNED -D CACHE_BF16
-D CACHE_ALIGNED -D RKV=512 -D DR=64 -D CACHE_FP8
-D CLMLA_PREFETCH -D CLMLA_HSUM8
-D CLMLA_NO_DENORMS -D W_DTYPE=3
-D QLAYOUT=1
-D QLAYOUT=1 -D HG=3 -D NT=64 -D RKV=40 -D DR=8
-D RKV=512 -D DR=64 -D CACHE_FP8 -D HPI=8 -D KPT=2
-D SPARSE
-D SPARSE -D RKV=512 -D DR=64 -D CACHE_FP8 -D QLAYOUT=1
-D MASK -D CACHE_F16
-D MASK -D HGC=6 -D RKV=40 -D DR=8 -D CACHE_BF16
-D MASK -D RS=2 -D CACHE_ALIGNED -D CACHE_BF16
-D MASK -D RKV=512 -D DR=64 -D CACHE_FP8 -D HPI=8 -D KPT=2
-D HG=3 -D NT=64 -D RKV=40 -D DR=8
-D HGC=6 -D RKV=40 -D DR=8 -D CACHE_BF16
-D HG=3 -D RKV=256 -D DR=32 -D CACHE_BF16
-D HG=3 -D RKV=256 -D DR=32 -D CACHE_FP8
-D KEY_BF16 -D HI=3 -D DI=24 -D BT=5
-D KEY_F16 -D HI=5 -D DI=10 -D DR=6 -D WGK=4 -D IDX_HALF_SPLIT
-D KEY_FP8 -D HI=5 -D DI=16 -D DR=6 -D WGK=4
-D ROWS_LANES -D LHV=1 -D HGC=16 -D KTC=8 -D CLMLA_PREFETCH -D CLMLA_FP8_HALF -D RKV=512 -D DR=64 -D CACHE_FP8
-D ROWS_LANES -D LHV=2 -D LFOLD -D HGC=16 -D KTC=8 -D RKV=40 -D DR=8 -D CACHE_BF16
-D ROWS_LANES -D LHV=1 -D HGC=16 -D KTC=8 -D SPARSE -D MASK -D CACHE_F16
-D MR=1 -D NCC=8 -D PCH=2048 -D CLMLA_PREFETCH -D PACKED_WIDE -D W_DTYPE=3 -D CLMLA_FP8_HALF
-D MR=1 -D NCC=8 -D PCH=1024 -D CLMLA_PREFETCH -D PACKED_WIDE -D W_DTYPE=2
-D MR=1 -D NCC=8 -D PCH=2048 -D CLMLA_PREFETCH -D W_BLOCK_SUMS -D W_DTYPE=3 -D CLMLA_FP8_HALF
-D TR=256 -D TC=48 -D KC=2048 -D TILED_DECODE -D W_DTYPE=3 -D CLMLA_FP8_HALF
-D TILED
-D TILED -D BQ=16 -D KPI=1
-D TILED -D BK=16 -D KPI=2 -D DN=16 -D DR=8 -D DV=8'
failed=0 checked=0
for f in "$dir"/*.cl; do
    [ "$(basename "$f")" = prelude.cl ] && continue
    cat "$dir/prelude.cl" "$f" >"$tmp/k.cl"
    : >"$tmp/seen"
    # each set cut to the names the text spells, each distinct cut set once
    echo "$sets" | awk 'NR == FNR { for (i = 1; i <= NF; i++) spelt[$i]; next }
        { cut = ""
          for (i = 1; i < NF; i++)
              if ($i == "-D") { name = $(i + 1); sub(/=.*/, "", name); if (name in spelt) cut = cut " -D " $(i + 1) }
          if (!(cut in done)) { done[cut]; print cut } }' FS='[^A-Za-z0-9_]+' "$tmp/k.cl" FS=' ' - |
    while IFS= read -r opts; do
        # shellcheck disable=SC2086
        text=$($cl -E -P $opts "$tmp/k.cl" 2>&1 | cksum)
        grep -qxF "$text" "$tmp/seen" && continue
        echo "$text" >>"$tmp/seen"
        echo x >>"$tmp/compiled"
        # shellcheck disable=SC2086
        if ! out=$($cl $target -Wall -Werror $opts "$tmp/k.cl" 2>&1); then
            echo "FAIL $(basename "$f") [$opts]:"
            echo "$out" | head -20
            echo x >>"$tmp/failed"
        fi
    done
    checked=$((checked + 1))
done
[ -f "$tmp/failed" ] && failed=$(wc -l <"$tmp/failed")
echo "kernel_warnings: $checked kernel files x $(echo "$sets" | wc -l) option sets," \
    "$(wc -l <"$tmp/compiled") distinct texts compiled, $failed with warnings or errors"
[ "$failed" -eq 0 ]
