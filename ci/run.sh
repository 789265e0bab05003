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

# A cache directory of the run's own, from empty. On PoCL's CPU device the library keeps no program
# binaries there unless asked (CLMLA_PROGRAM_BINARIES); test_context asks, to exercise that cache.
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

# The Python package as pip builds it (a wheel through scikit-build-core) and its pytest suite, in
# the background beside oclgrind: it keeps one core busy at most, and oclgrind's processes take
# whatever it leaves. Its output is printed when both are done; either failing fails the run.
# Then reliability (docs/RELIABILITY.md): every kernel under oclgrind, the whole suite again under
# AddressSanitizer + UndefinedBehaviorSanitizer (its sweeps short: ci/sanitize.sh), then the file
# parsers and the device-spec grammar under libFuzzer, 20 s per target from the committed corpus
# (ci/fuzz.sh's default is a minute; CI's 30 minutes do not hold six of them).
python_log=$(mktemp)
trap 'rm -f "$times_file" "$python_log"' EXIT
python_start=$(date +%s)
(
    rc=0
    sh ci/python.sh >"$python_log" 2>&1 || rc=$?
    echo "python: ci/python.sh exited $rc after $(($(date +%s) - python_start)) s" >>"$python_log"
    exit "$rc"
) &
python_pid=$!
oclgrind_rc=0
sh ci/oclgrind.sh build || oclgrind_rc=$?
python_rc=0
wait "$python_pid" || python_rc=$?
cat "$python_log"
stage "python and oclgrind"
if [ "$python_rc" != 0 ] || [ "$oclgrind_rc" != 0 ]; then
    echo "ci: failed: ci/python.sh exited $python_rc, ci/oclgrind.sh $oclgrind_rc"
    exit 1
fi
sh ci/sanitize.sh build-asan
stage "sanitize"
sh ci/fuzz.sh 20
stage "fuzz"
