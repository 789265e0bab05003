#!/bin/sh
# What CI runs: install dependencies, configure, build with -Werror, run the README's test command,
# then the reliability checks (oclgrind, sanitizers, fuzzing).
set -eu
cd "$(dirname "$0")/.."

sh ci/install-deps.sh

# A cache directory of the run's own, so CI exercises the program cache from empty.
export CLMLA_CACHE_DIR="${CLMLA_CACHE_DIR:-$PWD/build/clmla-cache}"

cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DCLMLA_WERROR=ON
cmake --build build -j"$(nproc)"
clinfo -l || true
./build/clmla devices
./build/clmla demo --decode 8

# The README's test command:
ctest --test-dir build --output-on-failure -j"$(nproc)"

# The Python package as pip builds it (a wheel through scikit-build-core) and its pytest suite.
sh ci/python.sh

# Reliability (docs/RELIABILITY.md): every kernel under oclgrind, the whole suite again under
# AddressSanitizer + UndefinedBehaviorSanitizer, then the file parsers and the device-spec grammar
# under libFuzzer (a minute per target).
sh ci/oclgrind.sh build
sh ci/sanitize.sh build-asan
sh ci/fuzz.sh
