#!/bin/sh
# Makes build/parity-venv, the Python environment with pinned torch and transformers that the
# parity suite (tests/parity/run.sh) and the llama.cpp end-to-end run (ggml/e2e.sh) use, or
# completes an older one. Run from the repository root.
set -eu
venv=build/parity-venv
if [ ! -x "$venv/bin/python" ]; then
	echo "parity: creating $venv" >&2
	python3 -m venv "$venv"
	"$venv/bin/pip" install --quiet --upgrade pip
	# PARITY_PIP_ARGS: extra pip arguments (another index, a proxy)
	# shellcheck disable=SC2086
	"$venv/bin/pip" install --quiet ${PARITY_PIP_ARGS:-} torch==2.15.0 transformers==5.24.0 numpy safetensors \
		accelerate==1.15.0 pytest
fi
# pytest runs the Python tests that need torch (added to the suite after the first venvs)
if ! "$venv/bin/python" -c 'import pytest' 2>/dev/null; then
	# shellcheck disable=SC2086
	"$venv/bin/pip" install --quiet ${PARITY_PIP_ARGS:-} pytest
fi
# transformers loads an FP8 folder only with accelerate (added to the suite after the first venvs)
if ! "$venv/bin/python" -c 'import accelerate' 2>/dev/null; then
	# shellcheck disable=SC2086
	"$venv/bin/pip" install --quiet ${PARITY_PIP_ARGS:-} accelerate==1.15.0
fi

