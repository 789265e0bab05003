#!/bin/sh
# tools/ptx_mix.py on a hand-written PTX sample (tests/fixtures/ptx/sample.ptx): the counts below were
# made by hand from its lines. No python3: skipped (77).
set -u
command -v python3 >/dev/null 2>&1 || { echo "skipped: no python3"; exit 77; }
root=$(cd "$(dirname "$0")/.." && pwd)
out=$(python3 "$root/tools/ptx_mix.py" "$root/tests/fixtures/ptx/sample.ptx") || { echo "$out"; exit 1; }
echo "$out"
fail=0
# instr fma f32 cvt int ldg lds sts other extra/fma
echo "$out" | grep -Eq 'decode4 +15 +2 +1 +1 +2 +1 +1 +1 +6 +6\.50$' || { echo "FAIL: decode4's counts"; fail=1; }
echo "$out" | grep -Eq 'cvt s32\.s8 1; global loads ld\.global\.nc\.v4\.u8 1' || { echo "FAIL: decode4's detail"; fail=1; }
echo "$out" | grep -Eq 'other +4 +0 +0 +2 +0 +1 +0 +0 +1 +-$' || { echo "FAIL: other's counts"; fail=1; }
echo "$out" | grep -Eq 'cvt f32\.f16 2' || { echo "FAIL: other's detail"; fail=1; }
only=$(python3 "$root/tools/ptx_mix.py" "$root/tests/fixtures/ptx/sample.ptx" --entry '^other$')
echo "$only" | grep -q decode4 && { echo "FAIL: --entry kept decode4"; fail=1; }
exit $fail
