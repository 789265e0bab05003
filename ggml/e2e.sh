#!/bin/sh
# llama.cpp end to end with the CLMLA backend, in one command:
#   1. builds what it needs (ggml/build.sh) and the Python environment (tests/parity/venv.sh);
#   2. makes a tiny random model of DeepSeek-V2-Lite's shape and converts it with llama.cpp's own
#      converter (ggml/tiny_deepseek.py; build/ggml/tiny/);
#   3. generates 64 tokens greedily with llama-completion, CPU only with flash attention on and
#      off, then with flash attention on and the CLMLA backend loaded (GGML_BACKEND_PATH); CLMLA's
#      tokens must equal the CPU's with flash attention, or, where the CPU's two runs part (a
#      token that hangs on rounding), one of them; the backend's own count of the flash attention
#      nodes it computed must be above zero;
#   4. the same through llama-cpp-python's own Python package (ggml/llama_cpp_python.py, over
#      this tree's libraries);
#   5. with --bench, llama-bench's pp512, tg128 and tg128 at depth 4096 for both, twice,
#      alternating, on a 4-layer model of the same attention (build/ggml/bench-cpu.md,
#      build/ggml/bench-clmla.md).
#
#   sh ggml/e2e.sh [--bench]
#
# Both runs pass --no-repack: llama.cpp 0.3.36's CPU weight repacking aborts on this model
# (GGML_ASSERT in ggml_backend_sched_split_graph) with or without clmla.
# Exit status: 0 when the outputs are equal and clmla computed the attention, else 1.
set -eu
cd "$(dirname "$0")/.."
root=$(pwd)
tree=$(sh ggml/build.sh | tail -n 1)
bin=$tree/build/bin
backend=$root/build-ggml/ggml/libggml-clmla.so
work=$root/build/ggml
sh tests/parity/venv.sh
model=$work/tiny/tiny-deepseek2-f16.gguf
if [ ! -f "$model" ]; then
	build/parity-venv/bin/python ggml/tiny_deepseek.py "$work/tiny" "$tree" >"$work/tiny-convert.log" 2>&1 || {
		tail -n 20 "$work/tiny-convert.log"
		exit 1
	}
fi
threads=$(nproc)

prompt="The latent cache holds one row per token, and the kernels read it"
gen() {
	"$bin/llama-completion" -m "$model" -p "$prompt" -n 64 -no-cnv --temp 0 --top-k 1 --ignore-eos "$@" \
		-c 4096 -t "$threads" --simple-io -fit off --no-repack --no-display-prompt --seed 1 -lv 4
}
(unset GGML_BACKEND_PATH; gen -fa on) >"$work/e2e-cpu.txt" 2>"$work/e2e-cpu.log"
(unset GGML_BACKEND_PATH; gen -fa off) >"$work/e2e-cpu-nofa.txt" 2>"$work/e2e-cpu-nofa.log"
# CLMLA_GGML_MIN_KV=0: every attention node on CLMLA, also those over the short contexts that the
# backend otherwise leaves to the CPU backend on CPU devices
CLMLA_GGML_MIN_KV=0 GGML_BACKEND_PATH=$backend gen -fa on >"$work/e2e-clmla.txt" 2>"$work/e2e-clmla.log"
status=0
# matches CPU CPU_NOFA CLMLA LABEL: whether CLMLA's output equals a CPU-only run's, all of it.
# ggml's CPU backend attends two ways: flash attention, which sums V in f16, and the separate
# matrix products, in f32. On a random model a greedy token can hang on that rounding (two logits
# closer than it), and the two CPU runs then part from that token on. CLMLA's tokens must equal
# the flash attention run's, or, where the CPU's two runs part, one of them; the line says which.
matches() {
	if [ ! -s "$1" ] || [ ! -s "$2" ]; then
		echo "e2e: FAILED: $4: a CPU-only run gave no output"
		return 1
	fi
	if cmp -s "$1" "$3"; then
		echo "e2e: $4: the 64 greedy tokens are the same as the CPU's (flash attention)"
	elif ! cmp -s "$1" "$2" && cmp -s "$2" "$3"; then
		echo "e2e: $4: the CPU's runs with and without flash attention part ($(cmp "$1" "$2" | sed 's/.*: //')):" \
			"a token hangs on the f16 rounding of the CPU's flash attention; the 64 greedy tokens are the same" \
			"as the CPU's without it"
	else
		echo "e2e: FAILED: $4: the outputs differ from the CPU's with and without flash attention ($1, $2, $3)"
		return 1
	fi
}
counted=$(grep -o "CLMLA: so far computed [0-9]* FLASH_ATTN_EXT nodes[^;]*; .*" "$work/e2e-clmla.log" | tail -n 1 || true)
echo "e2e: CPU only:   $(head -c 120 "$work/e2e-cpu.txt" | tr '\n' ' ')..."
echo "e2e: with CLMLA: $(head -c 120 "$work/e2e-clmla.txt" | tr '\n' ' ')..."
matches "$work/e2e-cpu.txt" "$work/e2e-cpu-nofa.txt" "$work/e2e-clmla.txt" llama-completion || status=1
if [ -n "$counted" ] && ! echo "$counted" | grep -q "computed 0 "; then
	echo "e2e: $counted"
else
	echo "e2e: FAILED: the CLMLA backend computed no flash attention node (build/ggml/e2e-clmla.log)"
	status=1
fi
if grep -q "CLMLA" "$work/e2e-cpu.log"; then
	echo "e2e: FAILED: the CPU-only run loaded the CLMLA backend"
	status=1
fi

# The same through llama-cpp-python's own Python package (the sdist's llama_cpp/, over this tree's
# libraries: LLAMA_CPP_LIB_PATH), 64 greedy tokens CPU only and with CLMLA
sdist=$(dirname "$(dirname "$tree")")
[ -d "$work/pydeps/diskcache" ] || build/parity-venv/bin/pip install --quiet --target "$work/pydeps" diskcache
py() {
	LLAMA_CPP_LIB_PATH=$bin PYTHONPATH=$sdist:$work/pydeps build/parity-venv/bin/python ggml/llama_cpp_python.py \
		"$model" 64 "$@"
}
(unset GGML_BACKEND_PATH; py) >"$work/e2e-py-cpu.txt" 2>"$work/e2e-py-cpu.log" || true
(unset GGML_BACKEND_PATH; py off) >"$work/e2e-py-cpu-nofa.txt" 2>"$work/e2e-py-cpu-nofa.log" || true
CLMLA_GGML_MIN_KV=0 GGML_BACKEND_PATH=$backend py >"$work/e2e-py-clmla.txt" 2>"$work/e2e-py-clmla.log" || true
counted=$(grep -o "CLMLA: so far computed [0-9]* FLASH_ATTN_EXT nodes[^;]*" "$work/e2e-py-clmla.log" | tail -n 1 || true)
if grep -q "^TOKENS " "$work/e2e-py-cpu.txt" && grep -q "^TOKENS " "$work/e2e-py-cpu-nofa.txt"; then
	matches "$work/e2e-py-cpu.txt" "$work/e2e-py-cpu-nofa.txt" "$work/e2e-py-clmla.txt" llama-cpp-python || status=1
	echo "e2e: llama-cpp-python: $counted"
else
	echo "e2e: FAILED: llama-cpp-python gave no tokens CPU only (build/ggml/e2e-py-cpu*.log)"
	status=1
fi
if [ -z "$counted" ] || echo "$counted" | grep -q "computed 0 "; then
	echo "e2e: FAILED: through llama-cpp-python the CLMLA backend computed no flash attention node"
	status=1
fi

if [ "${1:-}" = "--bench" ]; then
	# the bench's model has 4 layers (q through a LoRA, as DeepSeek-V2's): a 4096-token prefill of
	# the 27-layer one takes minutes here, and llama-bench makes one per repetition
	model4=$work/tiny4/tiny-deepseek2-f16.gguf
	if [ ! -f "$model4" ]; then
		build/parity-venv/bin/python ggml/tiny_deepseek.py "$work/tiny4" "$tree" 4 >"$work/tiny4-convert.log" 2>&1
	fi
	bench() {
		"$bin/llama-bench" -m "$model4" -fa 1 -p 512 -n 128 -d 0 -t "$threads" -r 3 --repack 0 -o md
		"$bin/llama-bench" -m "$model4" -fa 1 -p 0 -n 128 -d 4096 -t "$threads" -r 3 --repack 0 -o md
	}
	: >"$work/bench-cpu.md"
	: >"$work/bench-clmla.md"
	for round in 1 2; do
		(unset GGML_BACKEND_PATH; bench) >>"$work/bench-cpu.md" 2>>"$work/bench.log"
		GGML_BACKEND_PATH=$backend bench >>"$work/bench-clmla.md" 2>>"$work/bench.log"
		echo "e2e: llama-bench round $round done"
	done
	echo "== CPU only"
	cat "$work/bench-cpu.md"
	echo "== CPU + CLMLA"
	cat "$work/bench-clmla.md"
fi
exit "$status"
