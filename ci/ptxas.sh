#!/bin/sh
# Prints the path of a ptxas for the NVIDIA checks (tests/ptx_mma.sh, tools/vendor_build.py): PTXAS
# where set, else one on PATH or in /usr/local/cuda, else the one in PyPI's nvidia-cuda-nvcc wheel
# (pinned below), fetched once into build/ptxas/. Prints nothing and exits 1 where none can be had
# (no network): those checks then report themselves skipped.
#   sh ci/ptxas.sh        (run from anywhere; ci/run.sh exports its answer as PTXAS)
set -eu
cd "$(dirname "$0")/.."
version=13.5.37
for c in "${PTXAS:-}" "$(command -v ptxas 2>/dev/null || true)" /usr/local/cuda/bin/ptxas "$PWD/build/ptxas/ptxas"; do
    if [ -n "$c" ] && [ -x "$c" ]; then
        echo "$c"
        exit 0
    fi
done
mkdir -p build/ptxas
[ -x build/ptxas/venv/bin/pip ] || python3 -m venv build/ptxas/venv >&2
build/ptxas/venv/bin/pip download --quiet --no-deps "nvidia-cuda-nvcc==$version" -d build/ptxas >&2
python3 - build/ptxas <<'PY'
import glob, os, sys, zipfile
d = sys.argv[1]
wheel = glob.glob(os.path.join(d, "nvidia_cuda_nvcc-*.whl"))[0]
with zipfile.ZipFile(wheel) as z:
    member = next(n for n in z.namelist() if n.endswith("/bin/ptxas"))
    with z.open(member) as src, open(os.path.join(d, "ptxas"), "wb") as dst:
        dst.write(src.read())
os.chmod(os.path.join(d, "ptxas"), 0o755)
PY
rm -f build/ptxas/nvidia_cuda_nvcc-*.whl
"$PWD/build/ptxas/ptxas" --version >/dev/null
echo "$PWD/build/ptxas/ptxas"
