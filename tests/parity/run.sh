#!/bin/sh
# Parity of clmla's attention layer with transformers' own MLA attention modules, per family, in float64.
#
#   sh tests/parity/run.sh [--write-fixtures] [--check-fixtures] [--strict] [--only REGEX] [--device SPEC]
#
# Creates build/parity-venv (pinned torch/transformers) when it is missing, builds the tiny model folders
# under build/parity/, runs $CLMLA (default build/clmla) on each, prints the table and writes it to
# build/parity/RESULTS.md. --write-fixtures also rewrites tests/fixtures/parity/ (transformers output only).
# Exit status: non-zero when any case that clmla ran is over its tolerance (--strict: or clmla refused it).
set -eu

here=$(pwd)
root=$(cd "$(dirname "$0")/../.." && pwd)
clmla=${CLMLA:-$root/build/clmla}
case $clmla in
/*) ;;
*) clmla=$here/$clmla ;;
esac
cd "$root"

venv=build/parity-venv
if [ ! -x "$venv/bin/python" ]; then
	echo "parity: creating $venv" >&2
	python3 -m venv "$venv"
	"$venv/bin/pip" install --quiet --upgrade pip
	# PARITY_PIP_ARGS: extra pip arguments (another index, a proxy)
	# shellcheck disable=SC2086
	"$venv/bin/pip" install --quiet ${PARITY_PIP_ARGS:-} torch==2.15.0 transformers==5.24.0 numpy safetensors \
		accelerate==1.15.0
fi
# transformers loads an FP8 folder only with accelerate (added to the suite after the first venvs)
if ! "$venv/bin/python" -c 'import accelerate' 2>/dev/null; then
	# shellcheck disable=SC2086
	"$venv/bin/pip" install --quiet ${PARITY_PIP_ARGS:-} accelerate==1.15.0
fi

exec "$venv/bin/python" tests/parity/parity.py --clmla "$clmla" --out build/parity "$@"
