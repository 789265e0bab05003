#!/bin/sh
# What CI runs: install dependencies, configure, build with -Werror, run the README's test command.
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
ctest --test-dir build --output-on-failure
