#!/bin/sh
# Installs the build tree into a temporary prefix, then builds and runs a consumer twice: through
# the CMake package (find_package(clmla)) and through pkg-config.
set -eu
build_dir=$1
source_dir=$2
# A consumer needs what a developer installs: a compiler, pkg-config and the development files of
# clmla's dependencies (the CMake package finds them again). A machine with only their runtime
# libraries (a GPU machine running a carried build) has nothing to test this with.
for tool in cc pkg-config cmake; do
    command -v "$tool" >/dev/null 2>&1 || { echo "install: skipped, no $tool"; exit 77; }
done
for dep in OpenCL clblast libcjson; do
    pkg-config --exists "$dep" || { echo "install: skipped, the development files of $dep are not installed"; exit 77; }
done
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cmake --install "$build_dir" --prefix "$work/prefix" >/dev/null
libdir=$(ls -d "$work"/prefix/lib*/cmake/clmla | sed 's|/cmake/clmla$||')

cmake -S "$source_dir/tests/consumer" -B "$work/cmake-build" -DCMAKE_PREFIX_PATH="$work/prefix" >/dev/null
cmake --build "$work/cmake-build" >/dev/null
LD_LIBRARY_PATH="$libdir" "$work/cmake-build/consumer"

flags=$(PKG_CONFIG_PATH="$libdir/pkgconfig" pkg-config --cflags --libs clmla)
# shellcheck disable=SC2086
cc "$source_dir/tests/consumer/main.c" "$source_dir/tests/consumer/tuning.c" $flags -o "$work/pc-consumer"
LD_LIBRARY_PATH="$libdir" "$work/pc-consumer"
echo "install: CMake package and pkg-config consumers built and ran"
