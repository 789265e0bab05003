#!/bin/sh
# The GPU agenda of issues 23 and 24 as bounded runs, for the device tool's short loans: every
# step writes its output under OUT, in priority order; a step that would start past the budget is
# skipped (and named), and a step that runs on is stopped at the budget, so a run cut short still
# leaves everything before it.
#
#   sh tools/gpu-check.sh BUILD OUT [SECONDS [PARTS]]   (default budget 500 s; run it through
#                                                         tools/gpu-setup.sh run on a machine
#                                                         without the ICD loader, CLBlast and cJSON)
# PARTS, comma-separated, in the order given (default on an NVIDIA GPU mma,ab,tune,ptx,bench,tests:
# the experimental variants first, docs/DESIGN.md "The experimental variants, in one place"; on any
# other vendor's device (AMD ROCm, Intel's compute runtime, Mesa's rusticl), which has no built-in
# entry that a run measured, ab,tune,products,bench,tests; mma and ptx, which need NVIDIA's inline
# PTX and PTX binaries, are skipped there and say so); one call's parts share
# the peaks and the tuning file (a later call finds both in OUT):
#   tune   the latent tuner at 16 and 128 heads, then group_decode_heads over an fp8 cache (clmla
#          tune --cache-dtype), into OUT/kernel-tuning.json (about 110 s on an H100), then the
#          prefill tiles (clmla tune --prefill, not yet timed on a GPU)
#   products  the product tuner into the same file (226 s on an H100, mostly compiling; its
#          defaults won there, so a device with a built-in entry can leave it out)
#   mma    attn_latent_mma (group_mma 1, experimental: the latent products on the tensor cores
#          through inline PTX) over every cache dtype: checked against float64 on small shapes (dense,
#          sparse, folded), then timed beside the parameters in force at V2-Lite's and V3's shapes (two
#          rounds) and at V3.2's sparse decode, its PTX kept (about 250 s, estimated)
#   ab     the parameters in force against variants, each after its baseline (a copy of the
#          tuning file with them set; needs python3): the layer step at V2-Lite's and V3's shapes,
#          its kernels traced, with the products reading through vloadN (skinny_aligned 0); then
#          latent decode at V2-Lite's and V3's shapes over every cache dtype, bf16 and fp8 again
#          through vloadN (group_aligned 0), f16 with its halves converted in registers
#          (group_aligned 2, experimental); batch 1 and 8 with finer and coarser splits of the
#          keys (group_min_split_keys 32, 64, 256), with each key's dot products over 2 and 4 items
#          (group_row_slices, experimental, splits of 32 keys), one decode run traced; prefill and chunks
#          after a prefix by both paths (AUTO's crossover)
#   ptx    the device code of the latent kernel over each cache dtype (f16 also with
#          group_aligned 2) and of a V3 layer step's kernels in each weights dtype, one folder of
#          programs per variant under OUT/ptx (NVIDIA's binaries are PTX), and their instruction
#          mix (tools/ptx_mix.py) in OUT/ptx-mix.txt: what decoding a dtype costs beside the FMAs
#          it feeds (about 30 s)
#   bench  the rest of clmla-bench: V3's decode products (f32 / bf16 / fp8, 1 and 8 rows),
#          multi-token decode at 16 and 8 heads (8: folded into the heads), the layer step (and its
#          kernels, traced: CLMLA_TRACE, tools/trace_summary.py), V3's absorbed prefill with fp8
#          weights, the cold start
#   tests  the test suite (last by default: the tuner and the bench check their own results)
# OUT/summary.txt lists each step with its exit code and seconds, call after call; OUT/gpu-check.tar.gz
# holds everything (the device tool brings back only a few files). Calling the same parts again
# with the same OUT skips the steps already done: a loan split into calls runs the agenda once.
set -u
build=${1:?usage: sh tools/gpu-check.sh BUILD OUT [SECONDS [PARTS]]}
out=${2:?usage: sh tools/gpu-check.sh BUILD OUT [SECONDS [PARTS]]}
budget=${3:-500}
mkdir -p "$out"
clmla=$build/clmla
# the device the default spec picks (the line `clmla devices` marks with *): NVIDIA's or another's;
# CLMLA_GPU_CHECK_VENDOR=nvidia, intel (an Intel GPU) or other says which instead
# (tools/gpu-check-dry.sh runs each vendor's steps on a CPU device so)
nvidia=0
intel=0
case ${CLMLA_GPU_CHECK_VENDOR:-} in
nvidia) nvidia=1 ;;
intel) intel=1 ;;
other) ;;
'')
    "$clmla" devices 2>/dev/null | grep '^\*' | grep -q NVIDIA && nvidia=1
    "$clmla" devices 2>/dev/null | awk '/^\*/ && $4 == "gpu" && /Intel/' | grep -q . && intel=1
    ;;
*)
    echo "gpu-check: CLMLA_GPU_CHECK_VENDOR is nvidia, intel or other, not '$CLMLA_GPU_CHECK_VENDOR'" >&2
    exit 2
    ;;
esac
if [ "$nvidia" = 1 ]; then
    parts=${4:-mma,ab,tune,ptx,bench,tests}
else
    parts=${4:-ab,tune,products,bench,tests}
fi
bench=$build/bench/clmla-bench
start=$(date +%s)
export CLMLA_CACHE_DIR="${TMPDIR:-/tmp}/gpu-check-cache" # compiled kernels: not worth bringing back
export CLMLA_LOG="${CLMLA_LOG:-warning}" # what the library recovers from (an experimental kernel that did not build) in each step's file

# step NAME ESTIMATE COMMAND...: runs COMMAND into OUT/NAME.txt when ESTIMATE seconds still fit,
# stopped when the budget runs out; a step that an earlier call into the same OUT finished (exit 0)
# is not run again, so that the same parts called again go on where the last call stopped
step() {
    name=$1
    estimate=$2
    shift 2
    if [ -e "$out/.done-$name" ]; then
        echo "$name: done by an earlier call" >>"$out/summary.txt"
        return 0
    fi
    now=$(date +%s)
    left=$((budget - (now - start)))
    if [ "$estimate" -gt "$left" ]; then
        echo "$name: skipped (budget $budget s, $((now - start)) s used, needs about $estimate)" >>"$out/summary.txt"
        return 0
    fi
    timeout -k 5 "$left" "$@" >"$out/$name.txt" 2>&1
    rc=$?
    [ "$rc" = 0 ] && : >"$out/.done-$name"
    echo "$name: exit $rc in $(($(date +%s) - now)) s" >>"$out/summary.txt"
    tail -n 3 "$out/$name.txt"
}

# variant_tuning FILE KERNEL NAME=VALUE...: FILE = the parameters in force for this device (clmla tune
# --kernels --export, once per call into OUT/kernel-tuning-in-force.json: whole entries for 16 and 128
# heads and both K classes, from the tuning file in force, the built-in table or the defaults) with
# those parameters set in every entry of KERNEL (attn_latent or products), so that a variant differs
# from its baseline in them alone; needs python3
variant_tuning() {
    base="$out/kernel-tuning-in-force.json"
    if [ -z "${exported+set}" ]; then
        rm -f "$base"
        "$clmla" tune --kernels --export --out "$base" >>"$out/summary.txt" 2>&1 || return 0
        exported=1
    fi
    python3 - "$base" "$@" <<'PY' >>"$out/summary.txt" 2>&1
import json, sys
entries = json.load(open(sys.argv[1]))
for e in entries:
    if e.get("kernel") == sys.argv[3]:
        for kv in sys.argv[4:]:
            k, v = kv.split("=")
            e["parameters"][k] = int(v)
json.dump(entries, open(sys.argv[2], "w"), indent=1)
PY
}

part_tune() {
    tuning="$out/kernel-tuning.json"
    step tune-latent-16 60 "$clmla" tune --kernels --latent --heads 16 --out "$tuning"
    step tune-latent-128 40 "$clmla" tune --kernels --latent --heads 128 --out "$tuning"
    # group_decode_heads over an fp8 cache, from the entries just tuned
    step tune-latent-fp8-16 30 env CLMLA_KERNEL_TUNING="$tuning" "$clmla" tune --kernels --latent --heads 16 \
        --cache-dtype fp8 --out "$tuning"
    step tune-latent-fp8-128 30 env CLMLA_KERNEL_TUNING="$tuning" "$clmla" tune --kernels --latent --heads 128 \
        --cache-dtype fp8 --out "$tuning"
    # attn_prefill_tiled's tiles and keys an item (about 33 candidates, each a layer built and
    # checked; V3's float64 reference of 41 tokens takes the host tens of seconds)
    step tune-prefill-16 60 env CLMLA_KERNEL_TUNING="$tuning" "$clmla" tune --kernels --prefill --heads 16 \
        --out "$tuning"
    step tune-prefill-128 120 env CLMLA_KERNEL_TUNING="$tuning" "$clmla" tune --kernels --prefill --heads 128 \
        --out "$tuning"
}

part_products() {
    # 226 s on an H100 before the per-head (W^UK) search joined it, which adds V2-Lite and V3 layers
    # set up on the host (random weights, float64 reference) and a K split grid (estimate)
    step tune-products 300 "$clmla" tune --kernels --products --out "$out/kernel-tuning.json"
}

# the tuning file of the tune part (or none: the built-in table) and the peaks, once per call
bench_setup() {
    [ -n "${peaks+set}" ] && return 0
    [ -s "$out/kernel-tuning.json" ] && export CLMLA_KERNEL_TUNING="$out/kernel-tuning.json"
    step devices-tuned 5 "$clmla" devices --verbose
    [ -s "$out/peak.json" ] || step bench-peak 30 "$bench" --phase peak --json "$out/peak.json"
    peaks=""
    [ -s "$out/peak.json" ] && peaks="--peaks $out/peak.json" # else each run measures them briefly
    "$clmla" devices --json >"$out/devices.json" 2>/dev/null
}

# The parameters in force against variants, each right after its baseline: the layer step at
# V2-Lite's and V3's shapes, traced kernel by kernel, with gemm_skinny_nt and gemm_skinny_nn_split
# reading through vloadN (skinny_aligned 0, against the default 1, whole-vector loads, checked again
# on each new device); then latent decode over every cache dtype at V2-Lite's and V3's shapes, over
# bf16 and fp8 again through vloadN (group_aligned 0) and over f16 with its halves read as ushort4s
# and converted in registers (group_aligned 2, experimental); then both paths by prefix (AUTO's
# crossover). What earlier GPUs decided, and on which: docs/perf-log.md, "What is planned".
part_ab() {
    bench_setup
    variant_tuning "$out/kernel-tuning-al0.json" products skinny_aligned=0
    variant_tuning "$out/kernel-tuning-la0.json" attn_latent group_aligned=0
    variant_tuning "$out/kernel-tuning-la2.json" attn_latent group_aligned=2
    # Intel GPUs: attn_latent in 128 GRF as the Max 1550's entry was before group_large_grf (8 heads
    # of 256 items, 8 heads an item over decoded caches), beside the entry in force
    [ "$intel" = 1 ] && variant_tuning "$out/kernel-tuning-grf128.json" attn_latent group_large_grf=0 \
        group_max_items=256 group_decode_heads=8
    for v in base al0; do
        f=""
        [ "$v" = base ] || f="$out/kernel-tuning-$v.json"
        [ "$v" = base ] || { [ -s "$f" ] && [ -e "$out/.done-ab-layer-base" ]; } || continue # a variant only beside its baseline
        step ab-layer-$v 25 env ${f:+CLMLA_KERNEL_TUNING="$f"} "$bench" $peaks --phase layer --batch 1,8 --ctx 4096 \
            --weights-dtype f32,bf16,fp8 --json "$out/ab-layer-$v.json"
        step ab-layer-v3-$v 25 env ${f:+CLMLA_KERNEL_TUNING="$f"} "$bench" $peaks --phase layer --preset v3 --batch 1 \
            --ctx 4096 --weights-dtype f32,fp8 --json "$out/ab-layer-v3-$v.json"
        for run in v2-lite:f32 v3:fp8; do
            preset=${run%%:*}
            w=${run#*:}
            step ab-trace-$preset-$w-$v 20 env ${f:+CLMLA_KERNEL_TUNING="$f"} CLMLA_TRACE="$out/ab-trace-$preset-$w-$v.tsv" \
                "$bench" $peaks --phase layer --preset "$preset" --batch 1 --ctx 4096 --weights-dtype "$w" --max-time 0.5
            [ -s "$out/ab-trace-$preset-$w-$v.tsv" ] && step ab-trace-summary-$preset-$w-$v 5 python3 \
                "$(dirname "$0")/trace_summary.py" "$out/ab-trace-$preset-$w-$v.tsv" --skip 50 --per attn_latent
        done
    done
    for shape in v2-lite v3; do
        tag=$shape
        [ "$shape" = v2-lite ] && tag=v2lite
        secs=40
        [ "$shape" = v3 ] && secs=50
        step bench-decode-$tag $secs "$bench" $peaks --phase decode --preset "$shape" --path absorbed \
            --batch 1,8,32 --ctx 4096,32768 --cache-dtype f32,f16,bf16,fp8 --json "$out/decode-$tag.json"
        [ -e "$out/.done-bench-decode-$tag" ] || continue # the variants only beside their baseline
        # the decoded caches' rows through vloadN, and f16's halves converted in registers
        [ -s "$out/kernel-tuning-la0.json" ] && step bench-decode-$tag-la0 $((secs / 2)) \
            env CLMLA_KERNEL_TUNING="$out/kernel-tuning-la0.json" "$bench" $peaks --phase decode --preset "$shape" \
            --path absorbed --batch 1,8,32 --ctx 4096,32768 --cache-dtype bf16,fp8 --json "$out/decode-$tag-la0.json"
        [ -s "$out/kernel-tuning-la2.json" ] && step bench-decode-$tag-la2 $((secs / 3)) \
            env CLMLA_KERNEL_TUNING="$out/kernel-tuning-la2.json" "$bench" $peaks --phase decode --preset "$shape" \
            --path absorbed --batch 1,8,32 --ctx 4096,32768 --cache-dtype f16 --json "$out/decode-$tag-la2.json"
        [ "$intel" = 1 ] && [ -s "$out/kernel-tuning-grf128.json" ] && step bench-decode-$tag-grf128 $((secs / 2)) \
            env CLMLA_KERNEL_TUNING="$out/kernel-tuning-grf128.json" "$bench" $peaks --phase decode --preset "$shape" \
            --path absorbed --batch 1,8,32 --ctx 4096,32768 --cache-dtype f32,fp8 --json "$out/decode-$tag-grf128.json"
    done
    # the latent kernel at batch 1, where V2-Lite's step spends half its time in it (64 us over 4096
    # keys on the H200: 32 splits of 128 keys for 132 compute units): finer and coarser splits than
    # group_min_split_keys 128 beside the base rows, and one run traced (attn_latent against
    # attn_combine, which adds up the splits)
    for shape in v2-lite v3; do
        tag=$shape
        [ "$shape" = v2-lite ] && tag=v2lite
        [ -e "$out/.done-bench-decode-$tag" ] || continue
        for ms in 32 64 256; do
            variant_tuning "$out/kernel-tuning-ms$ms.json" attn_latent group_min_split_keys=$ms
            [ -s "$out/kernel-tuning-ms$ms.json" ] && step bench-decode-$tag-ms$ms 10 \
                env CLMLA_KERNEL_TUNING="$out/kernel-tuning-ms$ms.json" "$bench" $peaks --phase decode \
                --preset "$shape" --path absorbed --batch 1,8 --ctx 4096,32768 --cache-dtype f32,bf16 \
                --json "$out/decode-$tag-ms$ms.json"
        done
        # each key's dot products over 2 and 4 items (group_row_slices, experimental), with splits of
        # 32 keys: a chain of loads 2 and 4 times shorter per tile, and 4 times the work-groups
        for rs in 2 4; do
            variant_tuning "$out/kernel-tuning-rs$rs.json" attn_latent group_row_slices=$rs group_min_split_keys=32
            [ -s "$out/kernel-tuning-rs$rs.json" ] && step bench-decode-$tag-rs$rs 10 \
                env CLMLA_KERNEL_TUNING="$out/kernel-tuning-rs$rs.json" "$bench" $peaks --phase decode \
                --preset "$shape" --path absorbed --batch 1,8 --ctx 4096,32768 --cache-dtype f32,bf16 \
                --json "$out/decode-$tag-rs$rs.json"
        done
        step ab-trace-decode-$tag 10 env CLMLA_TRACE="$out/ab-trace-decode-$tag.tsv" "$bench" $peaks --phase decode \
            --preset "$shape" --path absorbed --batch 1 --ctx 4096 --cache-dtype bf16 --max-time 0.5
        [ -s "$out/ab-trace-decode-$tag.tsv" ] && step ab-trace-summary-decode-$tag 5 python3 \
            "$(dirname "$0")/trace_summary.py" "$out/ab-trace-decode-$tag.tsv" --skip 50 --per attn_latent
    done
    step bench-prefill 45 "$bench" $peaks --phase prefill --path decompressed,absorbed --ctx 512,4096 \
        --weights-dtype f32,bf16 --json "$out/prefill.json"
    step bench-prefix 40 "$bench" $peaks --phase prefill --path absorbed,decompressed --ctx 16,64,256,1024 \
        --prefix 0,1024,4096 --json "$out/prefix.json"
}

# attn_latent_mma (group_mma 1: the latent products on the tensor cores, experimental) against the
# parameters in force over f32, f16, bf16 and fp8 caches: first checked against float64 on small
# shapes (clmla-bench --check; test_attention and test_sparse_attention run every case with it in
# the tests part), then timed at V2-Lite's and V3's shapes, batch 1, 8 and 32, ctx 4096 and 32768,
# and at V3.2's sparse decode, each run after its baseline, and its PTX kept (ptx_run below) for its
# instruction mix
part_mma() {
    # the checks need no peaks: before bench_setup measures them (with the tune part's file, if any)
    [ -s "$out/kernel-tuning.json" ] && export CLMLA_KERNEL_TUNING="$out/kernel-tuning.json"
    variant_tuning "$out/kernel-tuning-mma.json" attn_latent group_mma=1
    [ -s "$out/kernel-tuning-mma.json" ] || return 0
    mma="$out/kernel-tuning-mma.json"
    step mma-check 30 env CLMLA_KERNEL_TUNING="$mma" "$bench" --no-peak --phase decode --path absorbed \
        --preset v3 --batch 1,3 --ctx 37,700 --cache-dtype f32,f16,bf16,fp8 --check --max-time 0.05
    step mma-check-v2lite 20 env CLMLA_KERNEL_TUNING="$mma" "$bench" --no-peak --phase decode --path absorbed \
        --batch 1,3 --ctx 37,700 --cache-dtype f32,f16,bf16,fp8 --check --max-time 0.05
    # DSA's selected keys (SPARSE) and two tokens of 4 heads folded into a group's rows (FOLD)
    step mma-check-sparse 20 env CLMLA_KERNEL_TUNING="$mma" "$bench" --no-peak --phase decode --path sparse \
        --preset v3 --batch 1,3 --ctx 700 --topk 512 --cache-dtype bf16,fp8 --check --max-time 0.05
    # (4 heads: the 16-head entry copied for any head count, which the exported file leaves to the
    # built-in table)
    python3 -c 'import copy, json, sys
e = json.load(open(sys.argv[1]))
a = copy.deepcopy([x for x in e if x.get("kernel") == "attn_latent"][0])
a.pop("heads", None)
json.dump(e + [a], open(sys.argv[2], "w"), indent=1)' "$mma" "$out/kernel-tuning-mma-any.json" >>"$out/summary.txt" 2>&1
    step mma-check-fold 15 env CLMLA_KERNEL_TUNING="$out/kernel-tuning-mma-any.json" "$bench" --no-peak \
        --phase decode --path absorbed \
        --heads 4 --q-len 2,4 --batch 1,3 --ctx 37,700 --cache-dtype bf16,fp8 --check --max-time 0.05
    bench_setup
    for shape in v2-lite v3; do
        tag=$shape
        [ "$shape" = v2-lite ] && tag=v2lite
        for round in 1 2; do
            step mma-decode-$tag-base$round 45 "$bench" $peaks --phase decode --preset "$shape" --path absorbed \
                --batch 1,8,32 --ctx 4096,32768 --cache-dtype f32,f16,bf16,fp8 --json "$out/mma-decode-$tag-base$round.json"
            step mma-decode-$tag-mma$round 45 env CLMLA_KERNEL_TUNING="$mma" "$bench" $peaks --phase decode \
                --preset "$shape" --path absorbed --batch 1,8,32 --ctx 4096,32768 --cache-dtype f32,f16,bf16,fp8 \
                --json "$out/mma-decode-$tag-mma$round.json"
        done
    done
    # DeepSeek-V3.2's decode: 128 heads over 2048 selected keys of an fp8 (and bf16) cache
    step mma-sparse-v3-base 30 "$bench" $peaks --phase decode --preset v3 --path sparse --topk 2048 \
        --batch 1,8,32 --ctx 32768 --cache-dtype bf16,fp8 --json "$out/mma-sparse-v3-base.json"
    step mma-sparse-v3-mma 30 env CLMLA_KERNEL_TUNING="$mma" "$bench" $peaks --phase decode --preset v3 \
        --path sparse --topk 2048 --batch 1,8,32 --ctx 32768 --cache-dtype bf16,fp8 --json "$out/mma-sparse-v3-mma.json"
    ptx_run latent-bf16-mma "$mma" --phase decode --path absorbed --batch 1 --ctx 256 --cache-dtype bf16
    ptx_run latent-f32-mma "$mma" --phase decode --path absorbed --batch 1 --ctx 256 --cache-dtype f32
    ptx_run latent-fp8-mma "$mma" --phase decode --path absorbed --batch 1 --ctx 256 --cache-dtype fp8
    ptx_run latent-f16-mma "$mma" --phase decode --path absorbed --batch 1 --ctx 256 --cache-dtype f16
}

# ptx_run NAME TUNING BENCH-ARGS...: one clmla-bench run with an empty program cache of its own,
# OUT/ptx/NAME, which so holds exactly the programs that run built; TUNING, if not empty, a tuning
# file for it (else the one in force)
ptx_run() {
    name=$1
    tuning=$2
    shift 2
    [ -e "$out/.done-ptx-$name" ] || { rm -rf "$out/ptx/$name" && mkdir -p "$out/ptx/$name"; }
    step ptx-$name 8 env CLMLA_CACHE_DIR="$out/ptx/$name" ${tuning:+CLMLA_KERNEL_TUNING="$tuning"} "$bench" --no-peak \
        --max-time 0.05 "$@"
}

part_ptx() {
    bench_setup
    variant_tuning "$out/kernel-tuning-la2.json" attn_latent group_aligned=2
    # Intel GPUs: attn_latent in 128 GRF as the Max 1550's entry was before group_large_grf (8 heads
    # of 256 items, 8 heads an item over decoded caches), beside the entry in force
    [ "$intel" = 1 ] && variant_tuning "$out/kernel-tuning-grf128.json" attn_latent group_large_grf=0 \
        group_max_items=256 group_decode_heads=8
    for d in f32 f16 bf16 fp8; do
        ptx_run latent-$d "" --phase decode --path absorbed --batch 1 --ctx 256 --cache-dtype $d
    done
    # f16's halves read as one ushort4 (ld.global.v4.u16) and converted in registers, where
    # vloada_half4 gave 4 ld.global.u16: whether the conversion stays in registers (cvt.f32.f16) or
    # goes through local memory (ld.local)
    [ -s "$out/kernel-tuning-la2.json" ] && ptx_run latent-f16-la2 "$out/kernel-tuning-la2.json" \
        --phase decode --path absorbed --batch 1 --ctx 256 --cache-dtype f16
    for w in f32 bf16 fp8; do
        ptx_run layer-v3-$w "" --phase layer --preset v3 --batch 1 --ctx 256 --weights-dtype $w
    done
    step ptx-mix 10 python3 "$(dirname "$0")/ptx_mix.py" "$out"/ptx/*
}

part_bench() {
    bench_setup
    step bench-products 40 "$bench" $peaks --phase products --preset v3 --batch 1,8 --weights-dtype f32,bf16,fp8 \
        --json "$out/products-v3.json"
    step bench-qlen-16 20 "$bench" $peaks --phase decode --path absorbed --batch 1,8 --ctx 32768 --q-len 1,2,4,8 \
        --json "$out/qlen-16.json"
    step bench-qlen-8 20 "$bench" $peaks --phase decode --path absorbed --preset custom --heads 8 --batch 1,8 \
        --ctx 32768 --q-len 1,2,4,8 --json "$out/qlen-8.json"
    step bench-layer 40 "$bench" $peaks --phase layer --batch 1,8 --ctx 4096 --weights-dtype f32,bf16,fp8 \
        --json "$out/layer.json"
    step bench-layer-v3 40 "$bench" $peaks --phase layer --preset v3 --batch 1 --ctx 4096 --weights-dtype f32,fp8 \
        --json "$out/layer-v3.json"
    # where a layer step's time goes, kernel by kernel and in the gaps between them (CLMLA_TRACE,
    # summed up by tools/trace_summary.py), one weights dtype per run so that their kernels stay apart
    for run in v3:f32 v3:fp8 v2-lite:f32 v2-lite:bf16; do
        preset=${run%%:*}
        w=${run#*:}
        step trace-layer-$preset-$w 20 env CLMLA_TRACE="$out/trace-layer-$preset-$w.tsv" "$bench" $peaks --phase layer \
            --preset "$preset" --batch 1 --ctx 4096 --weights-dtype "$w" --max-time 0.5
        [ -s "$out/trace-layer-$preset-$w.tsv" ] && step trace-summary-$preset-$w 5 python3 \
            "$(dirname "$0")/trace_summary.py" "$out/trace-layer-$preset-$w.tsv" --skip 50 --per attn_latent
    done
    # V3's 128 heads: the absorbed path's per-head products with fp8 weights (decoded in groups);
    # 8192 tokens run in 4 pieces of 2048 rows (layer.c: absorbed_piece_rows)
    step bench-prefill-v3 40 "$bench" $peaks --phase prefill --preset v3 --path absorbed --ctx 512,8192 \
        --weights-dtype f32,fp8 --json "$out/prefill-v3.json"
    # the cost before a first step: every kernel compiled, then from the disk cache (one sample each)
    step bench-cold 90 "$bench" $peaks --phase cold --quick --json "$out/cold.json"
}

# the quick tests first (most of them, and the GPU kernels' own), then the slow ones (full-size
# presets, the parity fixtures, the tuners), so that a cut call loses the least
part_tests() {
    step ctest-quick 60 ctest --test-dir "$build" -L quick -j16 --timeout 240 --output-on-failure
    step ctest-slow 60 ctest --test-dir "$build" -L slow -j16 --timeout 240 --output-on-failure
}

echo "== gpu-check $(date -u '+%F %T') UTC: parts $parts, budget $budget s" >>"$out/summary.txt"
step devices 5 "$clmla" devices --verbose
for p in $(echo "$parts" | tr ',' ' '); do
    case $p in
    tune) part_tune ;;
    products) part_products ;;
    mma | ptx)
        if [ "$nvidia" = 1 ]; then
            if [ "$p" = mma ]; then part_mma; else part_ptx; fi
        else
            echo "$p: skipped (not an NVIDIA device: it needs NVIDIA's inline PTX and PTX binaries)" >>"$out/summary.txt"
        fi
        ;;
    ab) part_ab ;;
    bench) part_bench ;;
    tests) part_tests ;;
    *) echo "gpu-check: unknown part $p (tune, products, mma, ab, ptx, bench, tests)" >>"$out/summary.txt" ;;
    esac
done
echo "gpu-check: $(($(date +%s) - start)) s; $out/summary.txt:"
cat "$out/summary.txt"
tar czf "$out/gpu-check.tar.gz" -C "$out" --exclude gpu-check.tar.gz . 2>/dev/null
