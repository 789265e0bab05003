#!/bin/sh
# Builds the libFuzzer targets of fuzz/ with clang (ASan + UBSan, every UB report fatal) in a build
# directory of their own and runs each for a bounded time over a copy of its seed corpus
# (fuzz/corpus/<target>/). Fails when a target crashes, leaks or times out on an input; the input
# is kept as build-fuzz/artifacts/crash-<target>-*. Needs clang and its libFuzzer runtime
# (Debian: clang, libclang-rt-dev; ci/install-deps.sh installs them).
#   sh ci/fuzz.sh [SECONDS_PER_TARGET]      (default 60, or $CLMLA_FUZZ_SECONDS)
set -eu
cd "$(dirname "$0")/.."

seconds=${1:-${CLMLA_FUZZ_SECONDS:-60}}
build=build-fuzz
targets="safetensors index npy config device_spec tuning"

CC=clang cmake -S . -B "$build" -DCLMLA_FUZZ=ON -DCLMLA_TESTS=OFF -DCLMLA_BENCH=OFF \
    -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
for t in $targets; do
    cmake --build "$build" -j"$(nproc)" --target "fuzz_$t"
done

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$build/artifacts"
status=0
for t in $targets; do
    # A copy: what the run adds to the corpus is not committed.
    mkdir -p "$work/$t"
    cp fuzz/corpus/"$t"/* "$work/$t/"
    echo "fuzz: fuzz_$t for ${seconds}s"
    if "$build/fuzz/fuzz_$t" "$work/$t" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 \
        -print_final_stats=1 -artifact_prefix="$build/artifacts/crash-$t-" >"$work/$t.log" 2>&1; then
        grep -E '^stat::number_of_executed_units|^Done' "$work/$t.log" || true
    else
        echo "fuzz: fuzz_$t FAILED; the input is in $build/artifacts/:"
        tail -n 60 "$work/$t.log"
        status=1
    fi
done
[ "$status" = 0 ] && echo "fuzz: every target ran ${seconds}s without a crash"
exit "$status"
