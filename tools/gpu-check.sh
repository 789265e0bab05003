#!/bin/sh
# The GPU agenda of issues 23 and 24 as one bounded run, for the device tool's short loans: every
# step writes its output under OUT, in priority order, and a step that would start past the budget
# is skipped (and named), so a run cut short still leaves everything before it.
#
#   sh tools/gpu-check.sh BUILD OUT [SECONDS]      (default budget 500 s; run it through
#                                                   tools/gpu-setup.sh run on a machine without
#                                                   the ICD loader, CLBlast and cJSON)
# Steps: devices; the test suite; the latent tuner at 16 and 128 heads and the product tuner into
# OUT/kernel-tuning.json; then clmla-bench with that file in force: peaks, latent decode (v2-lite
# and v3, batch 1 / 8 / 32, ctx 4096 / 32768, every cache dtype), multi-token decode at 16 and 8
# heads (8: folded into the heads), decode products (f32 / bf16 / fp8, 1 and 8 rows), the layer
# step, prefill, and both paths of chunks after a prefix (AUTO's crossover, which GPUs take
# from the FLOP count until measured). OUT/summary.txt lists each step with its exit code and seconds.
set -u
build=${1:?usage: sh tools/gpu-check.sh BUILD OUT [SECONDS]}
out=${2:?usage: sh tools/gpu-check.sh BUILD OUT [SECONDS]}
budget=${3:-500}
mkdir -p "$out"
clmla=$build/clmla
bench=$build/bench/clmla-bench
start=$(date +%s)
export CLMLA_CACHE_DIR="${TMPDIR:-/tmp}/gpu-check-cache" # compiled kernels: not worth bringing back

# step NAME ESTIMATE COMMAND...: runs COMMAND into OUT/NAME.txt when ESTIMATE seconds still fit
step() {
    name=$1
    estimate=$2
    shift 2
    now=$(date +%s)
    if [ $((now - start + estimate)) -gt "$budget" ]; then
        echo "$name: skipped (budget $budget s, $((now - start)) s used, needs about $estimate)" >>"$out/summary.txt"
        return 0
    fi
    "$@" >"$out/$name.txt" 2>&1
    rc=$?
    echo "$name: exit $rc in $(($(date +%s) - now)) s" >>"$out/summary.txt"
    tail -n 3 "$out/$name.txt"
}

: >"$out/summary.txt"
step devices 5 "$clmla" devices --verbose
step ctest 200 ctest --test-dir "$build" -j4 --timeout 120
tuning="$out/kernel-tuning.json"
step tune-latent-16 40 "$clmla" tune --kernels --latent --heads 16 --out "$tuning"
step tune-latent-128 40 "$clmla" tune --kernels --latent --heads 128 --out "$tuning"
step tune-products 90 "$clmla" tune --kernels --products --out "$tuning"
export CLMLA_KERNEL_TUNING="$tuning"
step bench-peak 30 "$bench" --phase peak --json "$out/peak.json"
peaks=""
[ -s "$out/peak.json" ] && peaks="--peaks $out/peak.json" # else each run measures them briefly
step bench-decode-v2 40 "$bench" $peaks --phase decode --path absorbed --batch 1,8,32 --ctx 4096,32768 \
    --cache-dtype f32,f16,bf16,fp8 --json "$out/decode-v2lite.json"
step bench-decode-v3 40 "$bench" $peaks --phase decode --preset v3 --path absorbed --batch 1,8 --ctx 4096,32768 \
    --cache-dtype f32,bf16,fp8 --json "$out/decode-v3.json"
step bench-qlen-16 20 "$bench" $peaks --phase decode --path absorbed --batch 1,8 --ctx 32768 --q-len 1,2,4,8 \
    --json "$out/qlen-16.json"
step bench-qlen-8 20 "$bench" $peaks --phase decode --path absorbed --preset custom --heads 8 --batch 1,8 --ctx 32768 \
    --q-len 1,2,4,8 --json "$out/qlen-8.json"
step bench-products 40 "$bench" $peaks --phase products --preset v3 --batch 1,8 --weights-dtype f32,bf16,fp8 \
    --json "$out/products-v3.json"
step bench-layer 40 "$bench" $peaks --phase layer --batch 1,8 --ctx 4096 --weights-dtype f32,bf16,fp8 \
    --json "$out/layer.json"
step bench-prefill 40 "$bench" $peaks --phase prefill --ctx 512,4096 --weights-dtype f32,bf16 \
    --json "$out/prefill.json"
step bench-prefix 40 "$bench" $peaks --phase prefill --path absorbed,decompressed --ctx 16,64,256,1024 \
    --prefix 0,1024,4096 --json "$out/prefix.json"
echo "gpu-check: $(($(date +%s) - start)) s; $out/summary.txt:"
cat "$out/summary.txt"
