#!/bin/sh
# The ggml backend against ggml's own conformance suite, in one command: builds what it needs
# (ggml/build.sh), then runs test-backend-ops on the CLMLA backend, loaded as an out-of-tree
# backend through GGML_BACKEND_PATH, against ggml's CPU backend.
#
#   sh ggml/ggml.sh [TEST_BACKEND_OPS_ARGS...]   (default: -o FLASH_ATTN_EXT -p hsk=576)
#
# Without arguments it then runs ggml/test-masks.c: the backend beside the CPU backend and a
# float64 reference over the masks llama.cpp builds (causal at depth, several sequences), which
# test-backend-ops' random masks do not make.
# Exit status: test-backend-ops', else test-masks'.
set -eu
cd "$(dirname "$0")/.."
root=$(pwd)
tree=$(sh ggml/build.sh | tail -n 1)
masks=0
if [ $# -eq 0 ]; then
	set -- -o FLASH_ATTN_EXT -p hsk=576
	masks=1
fi
# every case the backend can compute runs on it: on CPU devices the backend otherwise leaves
# attention over fewer than 512 KV rows to the CPU backend (CLMLA_GGML_MIN_KV, docs/LLAMA_CPP.md)
export CLMLA_GGML_MIN_KV="${CLMLA_GGML_MIN_KV:-0}"
echo "ggml: test-backend-ops $* on CLMLA ($root/build-ggml/ggml/libggml-clmla.so)"
GGML_BACKEND_PATH="$root/build-ggml/ggml/libggml-clmla.so" "$tree/build/bin/test-backend-ops" -b CLMLA "$@"
if [ "$masks" = 1 ]; then
	echo "ggml: test-masks on CLMLA"
	"$root/build-ggml/ggml/ggml-clmla-test-masks" "$tree/build/bin" "$root/build-ggml/ggml/libggml-clmla.so"
fi
