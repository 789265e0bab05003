#!/bin/sh
# Parity of clmla with transformers, per MLA family:
#   1. clmla's attention layer against transformers' own MLA attention modules in float64
#      (parity.py: builds the tiny model folders under build/parity/, runs $CLMLA, default
#      build/clmla, on each, prints the table and writes it to build/parity/RESULTS.md);
#   2. transformers' generate() through clmla.hf.attach against eager attention (generate.py:
#      build/parity/GENERATE.md), and the Python tests that need torch (python/tests:
#      test_transformers.py, test_hf.py, test_torch_ops.py, test_engine.py with torch), against the
#      libclmla beside $CLMLA.
#
#   sh tests/parity/run.sh [--write-fixtures] [--check-fixtures] [--strict] [--only REGEX] [--device SPEC]
#
# Creates build/parity-venv (pinned torch/transformers/accelerate) when it is missing, and brings an
# existing one to the pins (tests/parity/venv.sh). --write-fixtures also rewrites
# tests/fixtures/parity/ (transformers output only); it and --check-fixtures run part 1 alone.
# Exit status: non-zero when any case that clmla ran is over its tolerance (--strict: or clmla refused
# it), or when a generate case or a Python test fails.
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
sh tests/parity/venv.sh

status=0
"$venv/bin/python" tests/parity/parity.py --clmla "$clmla" --out build/parity "$@" || status=$?
only=""
part1_only=0
while [ $# -gt 0 ]; do
	case $1 in
	--only) only=$2; shift ;;
	--write-fixtures | --check-fixtures) part1_only=1 ;;
	esac
	shift
done
[ "$part1_only" = 1 ] && exit "$status"
lib=$(dirname "$clmla")/libclmla.so
export CLMLA_LIBRARY="$lib" CLMLA_CLI="$clmla" PYTHONPATH="$root/python/src"
mkdir -p build/parity
if [ -n "$only" ]; then
	"$venv/bin/python" tests/parity/generate.py --only "$only" --out build/parity/GENERATE.md || status=1
else
	"$venv/bin/python" tests/parity/generate.py --out build/parity/GENERATE.md || status=1
	"$venv/bin/python" -m pytest -q -p no:cacheprovider python/tests/test_transformers.py python/tests/test_hf.py \
		python/tests/test_engine.py \
		python/tests/test_torch_ops.py || status=1
fi
exit "$status"
