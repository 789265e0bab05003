#!/bin/sh
# `clmla kernels` on every device profile of tools/vendor/profiles: the library's own choice of
# programs and build options for each (V2-Lite, bf16 cache), which must name attn_latent with the
# heads and items its tuning gives, and attn_prefill_tiled with its tiles; and the profiles that must be refused, each by the field that
# is wrong: compute units of zero, a missing local memory size, local memory under what the kernels
# are written for, and (by tools/vendor_build.py) a missing architecture limit. Nothing is compiled.
#   sh tests/vendor_profiles.sh CLMLA ROOT
set -u
clmla=${1:?usage: vendor_profiles.sh CLMLA ROOT}
root=${2:?usage: vendor_profiles.sh CLMLA ROOT}
tmp=$(mktemp -d) || exit 1
trap 'rm -rf "$tmp"' EXIT
fail=0
for p in "$root"/tools/vendor/profiles/*.json; do
    if ! "$clmla" kernels --profile "$p" --preset v2-lite --cache-dtype bf16 >"$tmp/out" 2>"$tmp/err"; then
        echo "FAIL $p: clmla kernels exited non-zero:"; cat "$tmp/err"; fail=1; continue
    fi
    # 16 heads a group, but where a built-in entry (host/mla/tuning_data/attn_latent.json, issue 58's
    # compiled-not-run vendor entries) sets 8 heads of 256 items (AMD CDNA, Arc A770, Xe-LP) or of
    # 512 in IGC's 256-GRF mode (Max 1550)
    case $(basename "$p" .json) in
    mi300x | mi250 | arc-a770 | xe-lp) want="-D HG=8 .*-D NT=256" ;;
    max1550) want="-D HG=8 .*-cl-intel-256-GRF-per-thread -D NT=512" ;;
    *) want="-D HG=16 .*-D NT=128" ;;
    esac
    if ! grep -q "^v2-lite	bf16	attn_latent.cl	.*$want" "$tmp/out"; then
        echo "FAIL $p: no attn_latent build with $want:"; cat "$tmp/out"; fail=1
    fi
    # attn_prefill_tiled in blocks of 32 queries with 4 keys an item, but in blocks of 16 with 1 key
    # an item where a built-in entry sets them (AMD CDNA, Arc A770, Max 1550, Xe-LP)
    case $(basename "$p" .json) in
    mi300x | mi250 | arc-a770 | max1550 | xe-lp) want="-D BQ=16 -D BK=32 -D KC=64 -D KPI=1\$" ;;
    *) want="-D BQ=32 -D BK=32 -D KC=64\$" ;;
    esac
    if ! grep -q "^v2-lite	bf16	attn_prefill.cl	.*-D TILED $want" "$tmp/out"; then
        echo "FAIL $p: no attn_prefill_tiled build with $want:"; cat "$tmp/out"; fail=1
    fi
done
h100="$root/tools/vendor/profiles/h100.json"
refused() { # FILE FIELD: clmla kernels must exit 2 naming FIELD
    "$clmla" kernels --profile "$1" --preset v2-lite --cache-dtype bf16 >/dev/null 2>"$tmp/err"
    rc=$?
    if [ "$rc" != 2 ] || ! grep -q "refused.*$2" "$tmp/err"; then
        echo "FAIL: a profile with a bad $2 was not refused by name (exit $rc):"; cat "$tmp/err"; fail=1
    fi
}
sed 's/"compute_units": 132/"compute_units": 0/' "$h100" >"$tmp/cu.json"
refused "$tmp/cu.json" compute_units
grep -v '"local_mem_bytes"' "$h100" >"$tmp/nolocal.json"
refused "$tmp/nolocal.json" local_mem_bytes
sed 's/"local_mem_bytes": 49152/"local_mem_bytes": 16384/' "$h100" >"$tmp/small.json"
refused "$tmp/small.json" local_mem_bytes
if command -v python3 >/dev/null 2>&1; then
    grep -v '"max_warps_per_sm"' "$h100" >"$tmp/noarch.json"
    python3 "$root/tools/vendor_build.py" --clmla "$clmla" --profile "$tmp/noarch.json" --out "$tmp/report" \
        >/dev/null 2>"$tmp/err"
    rc=$?
    if [ "$rc" != 2 ] || ! grep -q "refused.*max_warps_per_sm" "$tmp/err"; then
        echo "FAIL: vendor_build.py took a profile without architecture.max_warps_per_sm (exit $rc):"
        cat "$tmp/err"; fail=1
    fi
fi
[ "$fail" = 0 ] && echo "vendor profiles: all planned, bad ones refused by name"
exit $fail
