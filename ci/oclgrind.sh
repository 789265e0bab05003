#!/bin/sh
# Runs every kernel of cl/ under oclgrind, an OpenCL simulator that checks each memory access:
# tests/test_kernels (small odd shapes, every kernel launched directly, then the library's own
# launches of them for CPU and GPU devices) three times:
#   1. the direct launches with every check: --check-api --data-races --uninitialized, 32 KiB of
#      local memory (the smallest common device), and --inst-counts, whose per-kernel report
#      shows which kernels oclgrind really ran;
#   2. the library's launches with every check (CLBlast's kernels included);
#   3. all of it again with the kernels optimised (--check-api --data-races).
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
export OCLGRIND_NUM_THREADS="${OCLGRIND_NUM_THREADS:-$(nproc)}"

status=0
# run NAME OCLGRIND_OPTIONS... -- TEST_ARGUMENTS...
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
    if oclgrind $opts --log "$work/$name.log" "$bin" "$@" >"$work/$name.out" 2>&1; then
        test_ok=1
    else
        test_ok=0
    fi
    seconds=$(($(date +%s) - start))
    if [ "$test_ok" = 1 ] && [ ! -s "$work/$name.log" ]; then
        echo "oclgrind: $name: clean ($(grep -E '^[0-9]+ passed' "$work/$name.out"), ${seconds}s)"
    else
        status=1
        echo "oclgrind: $name: FAILED (${seconds}s)"
        [ "$test_ok" = 1 ] || { echo "--- test output:"; grep -v '^ ' "$work/$name.out" | grep -v '^Instructions' | tail -n 40; }
        if [ -s "$work/$name.log" ]; then
            echo "--- oclgrind reported $(grep -c -E '^[A-Z]' "$work/$name.log") problem line(s); the first ones:"
            head -n 60 "$work/$name.log"
        fi
    fi
}

# attn_latent_mma's tf32 form with its products emulated is the slowest case by far under every
# check (about a minute); run 1 runs its bf16 form, which shares every line but the operand
# splits, and run 3 runs both. Its fp8 form crashes oclgrind 21.10 (a segmentation fault) under
# --uninitialized with -cl-opt-disable, so it too is left to run 3 (clean there).
mma_f32="mma: rkv 256 dr 32, 3 heads, 2 splits, f32"
mma_fp8="mma: rkv 256 dr 32, 3 heads, 2 splits, fp8"
every_check="--check-api --data-races --uninitialized --local-mem-size 32768 --build-options -cl-opt-disable"
# shellcheck disable=SC2086
run kernels $every_check --inst-counts -- --keep-buffers --skip "$mma_f32" --skip "$mma_fp8" kernels
# shellcheck disable=SC2086
run library $every_check -- --keep-buffers layer
run optimised --check-api --data-races --local-mem-size 32768 -- --keep-buffers

# Every __kernel of cl/*.cl must appear in oclgrind's own report of run 1.
kernels=$(perl -0777 -ne 'while (/__kernel\b.*?\bvoid\s+(\w+)\s*\(/sg) { print "$1\n" }' cl/*.cl | sort -u)
missing=""
count=0
for k in $kernels; do
    count=$((count + 1))
    grep -q "^Instructions executed for kernel '$k':" "$work/kernels.out" || missing="$missing $k"
done
if [ -n "$missing" ]; then
    status=1
    echo "oclgrind: kernels of cl/ that oclgrind never ran:$missing (add them to tests/test_kernels.c)"
else
    echo "oclgrind: all $count kernels of cl/ ran under oclgrind"
fi
exit "$status"
