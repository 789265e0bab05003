#!/bin/sh
# Makes build/parity-venv, the Python environment with pinned torch and transformers that the
# parity suite (tests/parity/run.sh) and the llama.cpp end-to-end run (ggml/e2e.sh) use, or
# brings an older one to the pins below. Run from the repository root.
set -eu
venv=build/parity-venv
# The pins (accelerate: transformers loads an FP8 folder only with it). A venv whose installed
# version of any of them differs, or that lacks one, gets all three installed at these versions.
pins="torch==2.15.0 transformers==5.25.0 accelerate==1.16.0"
if [ ! -x "$venv/bin/python" ]; then
	echo "parity: creating $venv" >&2
	python3 -m venv "$venv"
	"$venv/bin/pip" install --quiet --upgrade pip
	# PARITY_PIP_ARGS: extra pip arguments (another index, a proxy)
	# shellcheck disable=SC2086
	"$venv/bin/pip" install --quiet ${PARITY_PIP_ARGS:-} $pins numpy safetensors pytest
fi

# Prints the installed version of package $1 without its local label (torch's +cu132 or +cpu), or
# "none" when it is not installed.
installed() {
	"$venv/bin/python" -c 'import sys
from importlib.metadata import version
print(version(sys.argv[1]).split("+")[0])' "$1" 2>/dev/null || echo none
}

stale=""
for pin in $pins; do
	name=${pin%%==*}
	have=$(installed "$name")
	if [ "$have" != "${pin#*==}" ]; then
		stale="$stale $name $have"
	fi
done
if [ -n "$stale" ]; then
	echo "parity: $venv has$stale; installing $pins" >&2
	# shellcheck disable=SC2086
	"$venv/bin/pip" install --quiet ${PARITY_PIP_ARGS:-} $pins
fi
# pytest runs the Python tests that need torch (added to the suite after the first venvs)
if ! "$venv/bin/python" -c 'import pytest' 2>/dev/null; then
	# shellcheck disable=SC2086
	"$venv/bin/pip" install --quiet ${PARITY_PIP_ARGS:-} pytest
fi
