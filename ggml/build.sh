#!/bin/sh
# Fetches and builds what the ggml backend's runs need, once:
#   - llama.cpp as PyPI's llama-cpp-python source distribution carries it (pip download, into
#     build/ggml/), built as llama.cpp's releases are, with dynamically loaded backends
#     (GGML_BACKEND_DL, the CPU backend a library of
#     its own, built for this machine's instruction set): test-backend-ops, llama-completion,
#     llama-bench;
#   - clmla with libggml-clmla against that tree (build-ggml/).
#
#   sh ggml/build.sh      prints the llama.cpp tree's path on its last line
#
# Needs python3-venv, cmake, a C++ compiler and clmla's own dependencies (ci/install-deps.sh).
# LLAMA_CPP_PYTHON_VERSION picks the sdist (default 0.3.36). Logs: build/ggml/*.log.
set -eu
cd "$(dirname "$0")/.."
root=$(pwd)
version=${LLAMA_CPP_PYTHON_VERSION:-0.3.36}
work=$root/build/ggml
tree=$work/llama_cpp_python-$version/vendor/llama.cpp
mkdir -p "$work"

if [ ! -f "$tree/ggml/src/ggml-backend-impl.h" ]; then
	if [ ! -x "$work/venv/bin/pip" ]; then
		python3 -m venv "$work/venv"
	fi
	"$work/venv/bin/pip" download --quiet --no-deps --no-binary :all: "llama-cpp-python==$version" -d "$work"
	tar -xzf "$work/llama_cpp_python-$version.tar.gz" -C "$work"
fi
jobs=$(nproc)
# The CPU backend built for this machine's instruction set: the variant of GGML_CPU_ALL_VARIANTS
# with the most of its features (elsewhere than x86, all). The
# variants' targets depend on one another, so the first build compiles them all (20 minutes on 2
# cores), and later ones none.
has() { grep -qw "$1" /proc/cpuinfo 2>/dev/null; }
cpu=ggml-cpu
if [ "$(uname -m)" = x86_64 ]; then
	if has amx_tile && has amx_int8 && has avx512_bf16 && has avx512_vnni && has avx512vbmi; then cpu=ggml-cpu-sapphirerapids
	elif has avx512_bf16 && has avx512_vnni && has avx512vbmi; then cpu=ggml-cpu-zen4
	elif has avx512_vnni && has avx512vbmi; then cpu=ggml-cpu-icelake
	elif has avx512_vnni && has avx512f; then cpu=ggml-cpu-cascadelake
	elif has avx512vbmi; then cpu=ggml-cpu-cannonlake
	elif has avx512f; then cpu=ggml-cpu-skylakex
	elif has avx_vnni && has avx2; then cpu=ggml-cpu-alderlake
	elif has avx2 && has fma && has f16c && has bmi2; then cpu=ggml-cpu-haswell
	else cpu=ggml-cpu-x64
	fi
fi
# configured and built each time: both are incremental, seconds when nothing changed
echo "ggml: building llama.cpp in $tree/build (log: $work/llama-build.log)" >&2
cmake -S "$tree" -B "$tree/build" -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=ON \
	-DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DGGML_BACKEND_DL=ON -DGGML_NATIVE=OFF \
	-DGGML_CPU_ALL_VARIANTS=ON >"$work/llama-configure.log" 2>&1
cmake --build "$tree/build" -j"$jobs" --target test-backend-ops llama-completion llama-bench "$cpu" \
	>"$work/llama-build.log" 2>&1
cmake -S "$root" -B "$root/build-ggml" -DCMAKE_BUILD_TYPE=Release -DCLMLA_TESTS=OFF -DCLMLA_BENCH=OFF \
	-DCLMLA_GGML=ON -DCLMLA_GGML_SOURCE="$tree" >"$work/clmla-configure.log" 2>&1
cmake --build "$root/build-ggml" -j"$jobs" --target ggml-clmla ggml-clmla-test-masks >"$work/clmla-build.log" 2>&1
echo "$tree"
