#!/bin/sh
# Every kernel file, compiled as the library compiles it (cl/prelude.cl first) by the host's clang
# for OpenCL C 1.2 with -Wall -Werror, under each set of build options that selects other code: the
# weight and cache dtypes and their whole-vector loads, the CPU options, the query layout, masks, row
# slices, sparse lists. A warning here is a warning on some device's compiler (PoCL prints "N warnings
# generated" and clmla logs the build log at info level).
# Syntax only: nothing runs. Skipped (77) without a clang that compiles OpenCL C.
#   sh tests/kernel_warnings.sh CL_DIR
set -u
dir=${1:?usage: kernel_warnings.sh CL_DIR}
clang=${CLANG:-clang}
tmp=$(mktemp -d) || exit 1
trap 'rm -rf "$tmp"' EXIT
printf '__kernel void k(__global float *x) { x[0] = 1.0f; }\n' >"$tmp/probe.cl"
if ! "$clang" -x cl -cl-std=CL1.2 -Xclang -finclude-default-header -fsyntax-only "$tmp/probe.cl" 2>/dev/null; then
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
-D KEY_FP8 -D HI=5 -D DI=16 -D DR=6 -D WGK=4'
failed=0 checked=0
for f in "$dir"/*.cl; do
    [ "$(basename "$f")" = prelude.cl ] && continue
    cat "$dir/prelude.cl" "$f" >"$tmp/k.cl"
    echo "$sets" | while IFS= read -r opts; do
        # shellcheck disable=SC2086
        if ! out=$("$clang" -x cl -cl-std=CL1.2 -Xclang -finclude-default-header -fsyntax-only -Wall -Werror \
                   $opts "$tmp/k.cl" 2>&1); then
            echo "FAIL $(basename "$f") [$opts]:"
            echo "$out" | head -20
            echo x >>"$tmp/failed"
        fi
    done
    checked=$((checked + 1))
done
[ -f "$tmp/failed" ] && failed=$(wc -l <"$tmp/failed")
echo "kernel_warnings: $checked kernel files x $(echo "$sets" | wc -l) option sets, $failed with warnings or errors"
[ "$failed" -eq 0 ]
