#!/bin/sh
# What CI runs: install dependencies, configure, build with -Werror, run the README's test command,
# then the reliability checks (oclgrind, sanitizers, fuzzing).
set -eu
cd "$(dirname "$0")/.."

# Each stage prints its wall time and the CPU time its processes used (user + system, from the
# shell's `times`), so a CI log says where the minutes go and how busy the two cores were.
ci_start=$(date +%s)
stage_start=$ci_start
times_file=$(mktemp)
trap 'rm -f "$times_file"' EXIT
# the children's line of `times` ("1m2.5s 0m3.1s", written by this shell itself, not a subshell):
# their user + system seconds, whole
cpu_seconds() {
    awk 'NR == 2 { t = 0; for (i = 1; i <= 2; i++) { split($i, a, /[ms]/); t += a[1] * 60 + a[2] } printf "%d", t }' "$times_file"
}
times >"$times_file"
stage_cpu=$(cpu_seconds)
stage() {
    now=$(date +%s)
    times >"$times_file"
    cpu=$(cpu_seconds)
    echo "ci: $1 took $((now - stage_start)) s (total $((now - ci_start)) s), CPU $((cpu - stage_cpu)) s"
    stage_start=$now
    stage_cpu=$cpu
}

sh ci/install-deps.sh
# ptxas for the NVIDIA checks (ptx_mma, vendor_build's NVIDIA profile): the toolkit's, else PyPI's
if PTXAS=$(sh ci/ptxas.sh); then
    export PTXAS
    echo "ci: ptxas $PTXAS"
else
    unset PTXAS
    echo "ci: no ptxas could be had: ptx_mma and vendor_build's NVIDIA profile report themselves skipped"
fi
stage "install-deps"

# Compiles kept between runs: every CMake build below (the library and tests, the sanitizers' and
# the fuzzers' builds, the Python wheel, the install test's consumer) goes through ccache, which
# reuses an object only for the same compiler, options and source with its headers. Paths under the
# checkout are hashed relative to it, and the build folder left out of -g builds' hashes, so that a
# clone elsewhere finds the objects too.
if command -v ccache >/dev/null 2>&1; then
    export CMAKE_C_COMPILER_LAUNCHER=ccache CMAKE_CXX_COMPILER_LAUNCHER=ccache
    export CCACHE_BASEDIR="$PWD" CCACHE_NOHASHDIR=1
    ccache --zero-stats >/dev/null
fi

# A cache directory of the run's own, from empty. On PoCL's CPU device the library keeps no program
# binaries there unless asked (CLMLA_PROGRAM_BINARIES); test_context asks, to exercise that cache.
# Asking for them in every test would make PoCL compile every kernel of each new program for any
# work-group size too: a run after a kernel change would take several times as long to compile
# (docs/perf-log.md, "CI time").
export CLMLA_CACHE_DIR="${CLMLA_CACHE_DIR:-$PWD/build/clmla-cache}"

cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DCLMLA_WERROR=ON
cmake --build build -j"$(nproc)"
stage "configure and build"
clinfo -l || true
./build/clmla devices
./build/clmla demo --decode 8
stage "devices and demo"

# The README's test command:
ctest --test-dir build --output-on-failure -j"$(nproc)"
stage "ctest"

# Three things side by side, since none of them keeps both cores busy from start to end: the
# Python package as pip builds it (a wheel through scikit-build-core) and its pytest suite; the
# AddressSanitizer + UndefinedBehaviorSanitizer build of ci/sanitize.sh; and every kernel under
# oclgrind (docs/RELIABILITY.md). The first two print their output when all three are done; any of
# them failing fails the run. Then the whole suite again under the sanitizers (its sweeps short:
# ci/sanitize.sh), then the file parsers and the device-spec grammar under libFuzzer, 20 s per
# target from the committed corpus (ci/fuzz.sh's default is a minute; CI's 30 minutes do not hold
# six of them).
python_log=$(mktemp)
asan_log=$(mktemp)
trap 'rm -f "$times_file" "$python_log" "$asan_log"' EXIT
side_start=$(date +%s)
# beside LOG COMMAND...: COMMAND in the background, its output and then its exit status in LOG
beside() {
    log=$1
    shift
    (
        rc=0
        "$@" >"$log" 2>&1 || rc=$?
        echo "ci: '$*' exited $rc after $(($(date +%s) - side_start)) s" >>"$log"
        exit "$rc"
    ) &
}
beside "$python_log" sh ci/python.sh
python_pid=$!
beside "$asan_log" env CLMLA_SANITIZE_BUILD_ONLY=1 sh ci/sanitize.sh build-asan
asan_pid=$!
oclgrind_rc=0
sh ci/oclgrind.sh build || oclgrind_rc=$?
python_rc=0
wait "$python_pid" || python_rc=$?
asan_rc=0
wait "$asan_pid" || asan_rc=$?
cat "$python_log"
tail -n 3 "$asan_log"
stage "python, the sanitizers' build and oclgrind"
if [ "$python_rc" != 0 ] || [ "$asan_rc" != 0 ] || [ "$oclgrind_rc" != 0 ]; then
    [ "$asan_rc" = 0 ] || cat "$asan_log"
    echo "ci: failed: ci/python.sh exited $python_rc, the sanitizers' build $asan_rc, ci/oclgrind.sh $oclgrind_rc"
    exit 1
fi
sh ci/sanitize.sh build-asan
stage "sanitize"
sh ci/fuzz.sh 20
stage "fuzz"
if [ -n "${CMAKE_C_COMPILER_LAUNCHER:-}" ]; then
    echo "ci: ccache over the run: $(ccache --print-stats | awk '$1 ~ /^(direct_cache_hit|preprocessed_cache_hit|cache_miss)$/ { printf "%s %s ", $1, $2 }')"
fi
