#!/bin/sh
# Installs, with apt, whichever of clmla's build and test dependencies are missing. A no-op (no
# apt call at all) when everything is already there. Run as root on Debian 12 or newer.
set -eu

PACKAGES="cmake make gcc pkg-config ocl-icd-opencl-dev opencl-headers pocl-opencl-icd
libclblast-dev clinfo libcjson-dev clang libclang-rt-dev oclgrind perl
python3-venv python3-numpy python3-pytest"
PACKAGES="$PACKAGES clang-15 libclc-15 rocm-device-libs intel-opencl-icd" # vendor compilers: tools/vendor_build.py
PACKAGES="$PACKAGES ccache" # ci/run.sh: compiles kept between CI runs

missing=""
for p in $PACKAGES; do
    if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
        missing="$missing $p"
    fi
done

if [ -z "$missing" ]; then
    echo "install-deps: all dependencies are installed"
    exit 0
fi

echo "install-deps: installing$missing"
SUDO=""
if [ "$(id -u)" != 0 ]; then
    SUDO="sudo"
fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
# shellcheck disable=SC2086
$SUDO apt-get install -y -qq --no-install-recommends $missing
