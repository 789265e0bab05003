#!/bin/sh
# The ggml backend end to end, in one command: fetches llama.cpp as PyPI's llama-cpp-python source
# distribution carries it (pip download, into build/ggml/), builds its ggml and test-backend-ops,
# builds clmla with libggml-clmla against that tree (build-ggml/), and runs ggml's own conformance
# suite for the flash attention op on the backend, loaded as an out-of-tree backend through
# GGML_BACKEND_PATH.
#
#   sh ggml/ggml.sh [TEST_BACKEND_OPS_ARGS...]   (default: -o FLASH_ATTN_EXT -p hsk=576)
#
# Needs python3-venv, cmake, a C++ compiler and clmla's own dependencies (ci/install-deps.sh).
# LLAMA_CPP_PYTHON_VERSION picks the sdist (default 0.3.36). Exit status: test-backend-ops'.
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
if [ ! -x "$tree/build/bin/test-backend-ops" ]; then
	cmake -S "$tree" -B "$tree/build" -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=ON \
		-DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF >"$work/llama-configure.log"
	cmake --build "$tree/build" -j"$jobs" --target test-backend-ops >"$work/llama-build.log"
fi
cmake -S "$root" -B "$root/build-ggml" -DCMAKE_BUILD_TYPE=Release -DCLMLA_TESTS=OFF -DCLMLA_BENCH=OFF \
	-DCLMLA_GGML=ON -DCLMLA_GGML_SOURCE="$tree" >"$work/clmla-configure.log"
cmake --build "$root/build-ggml" -j"$jobs" --target ggml-clmla >"$work/clmla-build.log"

if [ $# -eq 0 ]; then
	set -- -o FLASH_ATTN_EXT -p hsk=576
fi
echo "ggml: test-backend-ops $* on CLMLA ($root/build-ggml/ggml/libggml-clmla.so)"
GGML_BACKEND_PATH="$root/build-ggml/ggml/libggml-clmla.so" "$tree/build/bin/test-backend-ops" -b CLMLA "$@"
