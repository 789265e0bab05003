#!/bin/sh
# Runs every kernel of cl/ under oclgrind, an OpenCL simulator that checks each memory access:
# tests/test_kernels (small odd shapes, every kernel launched directly, then the library's own
# launches of them for CPU and GPU devices) in four runs, as processes side by side:
#   1. the direct launches with every check: --check-api --data-races --uninitialized, 32 KiB of
#      local memory (the smallest common device), and --inst-counts, whose per-kernel report
#      shows which kernels oclgrind really ran (five processes: below);
#   2. the library's launches with every check (CLBlast's kernels included);
#   3. the two cases run 1 leaves out (below) with the kernels optimised (--check-api --data-races,
#      --inst-counts);
#   4. tests/test_paged's calls over a caller's cache with bad block tables, lengths and slots, the
#      indexer's selection, masked calls and the refusals (--check-api --data-races): what a bad
#      table given by an engine makes the kernels read.
# Runs 1 and 2 build kernels with -cl-opt-disable: oclgrind 21.10's uninitialised-value checker
# stops at LLVM's `freeze` instruction, which optimised builds contain (fixed after 21.10). They
# also pass --keep-buffers: that checker keeps the state of a released buffer for the next buffer
# that reuses its slot, so a program that frees buffers as it goes (the library does, after every
# step) gets false reports; test_kernels then keeps every buffer to the end.
# oclgrind exits 0 whatever it finds, so the script reads its log: any line in it fails the run,
# as does a `__kernel` of cl/*.cl that run 1 did not execute, or a failed check of the test itself.
#   sh ci/oclgrind.sh [BUILD_DIR]      (default build; tests/test_kernels must be built there)
set -eu
cd "$(dirname "$0")/.."

build=${1:-build}
bin=$build/tests/test_kernels
if ! command -v oclgrind >/dev/null 2>&1; then
    echo "oclgrind: not installed (ci/install-deps.sh installs the Debian package)"
    exit 1
fi
if [ ! -x "$bin" ]; then
    echo "oclgrind: $bin is missing; build the tests first"
    exit 1
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# oclgrind's program binaries are its own LLVM IR: the disk cache would only hold copies of them.
export CLMLA_CACHE_DIR=off
# oclgrind runs one work-group at a time unless told otherwise; its checks hold across threads.
# The runs below are processes side by side, one thread each unless told otherwise.
export OCLGRIND_NUM_THREADS="${OCLGRIND_NUM_THREADS:-1}"

status=0
# run NAME OCLGRIND_OPTIONS... -- TEST_ARGUMENTS...: one oclgrind process; its output, its log, its
# exit status and its seconds go to $work/NAME.{out,log,ok,seconds}.
run() {
    name=$1
    shift
    opts=""
    while [ "$1" != "--" ]; do
        opts="$opts $1"
        shift
    done
    shift
    start=$(date +%s)
    # shellcheck disable=SC2086
    if oclgrind $opts --log "$work/$name.log" "${run_bin:-$bin}" "$@" >"$work/$name.out" 2>&1; then
        echo 1 >"$work/$name.ok"
    else
        echo 0 >"$work/$name.ok"
    fi
    echo $(($(date +%s) - start)) >"$work/$name.seconds"
}

# report NAME: what run NAME found; a failure sets status.
report() {
    name=$1
    seconds=$(cat "$work/$name.seconds")
    if [ "$(cat "$work/$name.ok")" = 1 ] && [ ! -s "$work/$name.log" ]; then
        echo "oclgrind: $name: clean ($(grep -E '^[0-9]+ passed' "$work/$name.out"), ${seconds}s)"
    else
        status=1
        echo "oclgrind: $name: FAILED (${seconds}s)"
        [ "$(cat "$work/$name.ok")" = 1 ] || { echo "--- test output:"; grep -v '^ ' "$work/$name.out" | grep -v '^Instructions' | tail -n 40; }
        if [ -s "$work/$name.log" ]; then
            echo "--- oclgrind reported $(grep -c -E '^[A-Z]' "$work/$name.log") problem line(s); the first ones:"
            head -n 60 "$work/$name.log"
        fi
    fi
}

# attn_latent_mma's tf32 form (three emulated products for each of the others' one) is its slowest
# case under every check; run 1 runs its bf16 form, which shares every line but the operand
# splits, and its fp8 form (the weights' terms made only where a scale block begins: what the
# uninitialised-value checker is for); run 3 runs the tf32 form and the f16 one, which differs
# from the bf16 one in its conversions and its queries' scaling ("mma: rkv 256 dr 32, 3 heads, 2
# splits, f32" and "..., f16" in tests/test_kernels.c: the text below picks them and the fp8 case,
# which it skips, and run 3 fails unless attn_latent_mma ran). Run 3 does not run every case again:
# the accesses a kernel makes are its source's, which runs 1 and 2 check; LLVM's optimiser drops
# some, and hoists or widens a load only where it is known to be in bounds.
mma_left="mma: rkv 256 dr 32, 3 heads, 2 splits, f"
every_check="--check-api --data-races --uninitialized --local-mem-size 32768 --build-options -cl-opt-disable"
# The runs are processes side by side, one thread each (OCLGRIND_NUM_THREADS): run 1 is five of
# them, attn_latent's two cases that take longest under every check (each built with each of its
# variants' options), the rest of the latent group but for attn_latent_mma, attn_latent_mma's bf16
# case and its fp8 case, and the other three groups (docs/perf-log.md has their times). The latent
# group's checks that are not cases (attn_combine's) run in both of its processes.
mma_bf16="mma: rkv 256 dr 32, 3 heads, 2 splits, bf16"
mma_fp8="mma: rkv 256 dr 32, 3 heads, 2 splits, fp8"
group_d="rkv 21 dr 2, 13 heads / 16 per group"
group_b="rkv 72 dr 8, 8 heads / 8 per group"
# shellcheck disable=SC2086
run kernels-group $every_check --inst-counts -- --keep-buffers --only "$group_d" --only "$group_b" latent &
# shellcheck disable=SC2086
run kernels-latent $every_check --inst-counts -- --keep-buffers --skip "mma:" --skip "$group_d" --skip "$group_b" \
    latent &
# shellcheck disable=SC2086
run kernels-mma $every_check --inst-counts -- --keep-buffers --only "$mma_bf16" latent &
# shellcheck disable=SC2086
run kernels-mma-fp8 $every_check --inst-counts -- --keep-buffers --only "$mma_fp8" latent &
# shellcheck disable=SC2086
run kernels-other $every_check --inst-counts -- --keep-buffers other prefill gemm &
# run 2 is two processes: the dense layer, and DSA's layer with the split attention (each as on a
# CPU device and as on a GPU)
# shellcheck disable=SC2086
run library-dense $every_check -- --keep-buffers layer-dense &
# shellcheck disable=SC2086
run library-dsa $every_check -- --keep-buffers layer-dsa &
run optimised --check-api --data-races --local-mem-size 32768 --inst-counts -- --keep-buffers --only "$mma_left" \
    --skip "$mma_fp8" latent &
run_bin=$build/tests/test_paged run paged --check-api --data-races --local-mem-size 32768 -- bad_tables index mask \
    refusals &
wait
for name in kernels-group kernels-latent kernels-mma kernels-mma-fp8 kernels-other library-dense library-dsa optimised paged; do
    report "$name"
done
if ! grep -q "^Instructions executed for kernel 'attn_latent_mma':" "$work/optimised.out"; then
    status=1
    echo "oclgrind: optimised: attn_latent_mma never ran (no case of tests/test_kernels.c names '$mma_left')"
fi

# Every __kernel of cl/*.cl must appear in oclgrind's own report of run 1.
kernels=$(perl -0777 -ne 'while (/__kernel\b.*?\bvoid\s+(\w+)\s*\(/sg) { print "$1\n" }' cl/*.cl | sort -u)
missing=""
count=0
for k in $kernels; do
    count=$((count + 1))
    cat "$work"/kernels-*.out | grep -q "^Instructions executed for kernel '$k':" ||
        missing="$missing $k"
done
if [ -n "$missing" ]; then
    status=1
    echo "oclgrind: kernels of cl/ that oclgrind never ran:$missing (add them to tests/test_kernels.c)"
else
    echo "oclgrind: all $count kernels of cl/ ran under oclgrind"
fi
exit "$status"
