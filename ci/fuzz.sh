#!/bin/sh
# Builds the libFuzzer targets of fuzz/ with clang (ASan + UBSan, every UB report fatal) in a build
# directory of their own and runs each for a bounded time over a copy of its seed corpus
# (fuzz/corpus/<target>/), as many at once as there are cores. Fails when a target crashes, leaks
# or times out on an input; the input is kept as build-fuzz/artifacts/crash-<target>-*. Needs clang
# and its libFuzzer runtime (Debian: clang, libclang-rt-dev; ci/install-deps.sh installs them).
#   sh ci/fuzz.sh [SECONDS_PER_TARGET]      (default 60, or $CLMLA_FUZZ_SECONDS)
set -eu
cd "$(dirname "$0")/.."

seconds=${1:-${CLMLA_FUZZ_SECONDS:-60}}
build="build-fuzz"
targets="safetensors index npy config device_spec tuning"

CC=clang cmake -S . -B "$build" -DCLMLA_FUZZ=ON -DCLMLA_TESTS=OFF -DCLMLA_BENCH=OFF \
    -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
for t in $targets; do
    cmake --build "$build" -j"$(nproc)" --target "fuzz_$t"
done

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$build/artifacts"

# fuzz TARGET: one target over a copy of its corpus (what the run adds is not committed); its exit
# status goes to $work/TARGET.rc.
fuzz() {
    mkdir -p "$work/$1"
    cp fuzz/corpus/"$1"/* "$work/$1/"
    rc=0
    "$build/fuzz/fuzz_$1" "$work/$1" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 \
        -print_final_stats=1 -artifact_prefix="$build/artifacts/crash-$1-" >"$work/$1.log" 2>&1 || rc=$?
    echo "$rc" >"$work/$1.rc"
}

# As many targets at once as there are cores: each is single-threaded, and the time is the CI's.
jobs=$(nproc)
running=0
for t in $targets; do
    echo "fuzz: fuzz_$t for ${seconds}s"
    fuzz "$t" &
    running=$((running + 1))
    if [ "$running" -ge "$jobs" ]; then
        wait
        running=0
    fi
done
wait

status=0
for t in $targets; do
    if [ "$(cat "$work/$t.rc")" = 0 ]; then
        echo "fuzz: fuzz_$t: $(grep -E '^Done' "$work/$t.log" || echo "finished")"
    else
        echo "fuzz: fuzz_$t FAILED; the input is in $build/artifacts/:"
        tail -n 60 "$work/$t.log"
        status=1
    fi
done
[ "$status" = 0 ] && echo "fuzz: every target ran ${seconds}s without a crash"
exit "$status"
