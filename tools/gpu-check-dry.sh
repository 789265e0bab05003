#!/bin/sh
# Every step of tools/gpu-check.sh's agenda on whatever device is here (PoCL's CPU device will do),
# with tiny shapes and short timing, so that a command line, a tuning file or a summary that no
# longer works shows before a GPU is lent, not during the loan. Nothing it times means anything.
#
#   sh tools/gpu-check-dry.sh BUILD OUT
#
# It makes OUT/build, in which `clmla` and `bench/clmla-bench` stand for BUILD's: clmla-bench gets
# --ctx 64, --batch 1 and --max-time 0.02 in place of what the step asks, and `clmla tune` gets
# --quick. Then gpu-check.sh runs twice, into OUT/nvidia and OUT/intel, as if the device were that
# vendor's (CLMLA_GPU_CHECK_VENDOR), every part but tests: NVIDIA's parts, and Intel's (another
# vendor's, AMD's and rusticl's, plus the 128-GRF variant). A step that exits other than 0 fails the
# run, except where a CPU device is known to refuse it (listed below; excused on CPU devices only),
# and so does a step left out for the budget or a call that ran no step. About 10 minutes on 2 cores.
set -u
build=${1:?usage: sh tools/gpu-check-dry.sh BUILD OUT}
out=${2:?usage: sh tools/gpu-check-dry.sh BUILD OUT}
case $build in /*) ;; *) build=$PWD/$build ;; esac
here=$(cd "$(dirname "$0")" && pwd)
for f in "$build/clmla" "$build/bench/clmla-bench"; do
    if [ ! -x "$f" ]; then
        echo "gpu-check-dry: $f is missing; build the project first"
        exit 1
    fi
done
rm -rf "$out"
mkdir -p "$out/build/bench"
fake=$out/build

cat >"$fake/bench/clmla-bench" <<EOF
#!/bin/sh
# clmla-bench with --ctx 64, --batch 1 and --max-time 0.02 (written by tools/gpu-check-dry.sh)
n=\$#
timed=0
while [ "\$n" -gt 0 ]; do
    a=\$1
    shift
    n=\$((n - 1))
    case \$a in
    --ctx | --batch | --max-time)
        [ "\$n" -gt 0 ] && { shift; n=\$((n - 1)); }
        case \$a in
        --ctx) set -- "\$@" --ctx 64 ;;
        --batch) set -- "\$@" --batch 1 ;;
        *) timed=1 && set -- "\$@" --max-time 0.02 ;;
        esac
        ;;
    *) set -- "\$@" "\$a" ;;
    esac
done
[ "\$timed" = 1 ] || set -- "\$@" --max-time 0.02
exec "$build/bench/clmla-bench" "\$@"
EOF
cat >"$fake/clmla" <<EOF
#!/bin/sh
# clmla, with --quick after \`tune\` (written by tools/gpu-check-dry.sh)
if [ "\$1" = tune ]; then
    exec "$build/clmla" "\$@" --quick
fi
exec "$build/clmla" "\$@"
EOF
chmod +x "$fake/clmla" "$fake/bench/clmla-bench"

# name<TAB>why: the steps a CPU device refuses by design
expected='tune-latent-fp8-16	clmla_tune_latent over a decoded cache tunes attn_latent, which CPU devices do not run
tune-latent-fp8-128	the same
ptx-mix	a CPU device keeps no program binaries here, so there is no PTX to count'

# the refusals above are excused only where the default device is a CPU
cpu=0
"$build/clmla" devices 2>/dev/null | awk '/^\*/ && $4 == "cpu"' | grep -q . && cpu=1
for vendor in nvidia intel; do
    parts=ab,tune,products,bench
    [ "$vendor" = nvidia ] && parts=mma,ab,tune,ptx,bench
    start=$(date +%s)
    CLMLA_GPU_CHECK_VENDOR=$vendor sh "$here/gpu-check.sh" "$fake" "$out/$vendor" 100000 "$parts" >"$out/$vendor.log" 2>&1
    steps=$(grep -c ': exit [0-9]* in ' "$out/$vendor/summary.txt" 2>/dev/null)
    if [ "${steps:-0}" = 0 ]; then
        echo "gpu-check-dry: as $vendor: gpu-check.sh ran no step; the end of $out/$vendor.log:"
        tail -n 5 "$out/$vendor.log" | sed 's/^/    /'
        echo x >>"$out/failed"
        continue
    fi
    failed=$(sed -n 's/^\([^:]*\): exit \([1-9][0-9]*\) in .*/\1 \2/p' "$out/$vendor/summary.txt")
    echo "gpu-check-dry: as $vendor: $steps steps in $(($(date +%s) - start)) s"
    echo "$failed" | while read -r name rc; do
        [ -n "$name" ] || continue
        why=""
        [ "$cpu" = 1 ] && why=$(echo "$expected" | awk -F '\t' -v n="$name" '$1 == n { print $2 }')
        if [ -n "$why" ]; then
            echo "  $name: exit $rc, as expected on a CPU device ($why)"
        else
            echo "  $name: exit $rc: FAILED; the last lines of $out/$vendor/$name.txt:"
            tail -n 5 "$out/$vendor/$name.txt" | sed 's/^/    /'
            echo x >>"$out/failed"
        fi
    done
    if grep -q 'skipped (budget' "$out/$vendor/summary.txt"; then
        echo "  steps skipped for the budget: $(grep 'skipped (budget' "$out/$vendor/summary.txt" | cut -d: -f1 | tr '\n' ' ')"
        echo x >>"$out/failed"
    fi
done
if [ -s "$out/failed" ]; then
    echo "gpu-check-dry: FAILED (above)"
    exit 1
fi
echo "gpu-check-dry: every step ran"

