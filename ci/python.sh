#!/bin/sh
# The Python package as a user installs it, on a fresh Debian 12 as root: makes sure python3 and
# venv exist, builds and installs the wheel with pip (scikit-build-core, the same CMake project) into
# build/python-venv with numpy and pytest, and runs python/tests against the installed package (the
# command-line parity tests use build/clmla when it exists; CLMLA_CLI overrides it).
#   sh ci/python.sh
set -eu
cd "$(dirname "$0")/.."
root=$PWD

sh ci/install-deps.sh
missing=""
command -v python3 >/dev/null 2>&1 || missing="$missing python3"
python3 -c "import venv, ensurepip" >/dev/null 2>&1 || missing="$missing python3-venv"
python3 -m pip --version >/dev/null 2>&1 || missing="$missing python3-pip"
if [ -n "$missing" ]; then
    echo "python: installing$missing"
    SUDO=""
    [ "$(id -u)" = 0 ] || SUDO="sudo"
    export DEBIAN_FRONTEND=noninteractive
    $SUDO apt-get update -qq
    # shellcheck disable=SC2086
    $SUDO apt-get install -y -qq --no-install-recommends $missing
fi

venv=$root/build/python-venv
if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c "" >/dev/null 2>&1; then
    rm -rf "$venv"
    python3 -m venv "$venv"
fi
start=$(date +%s)
# A real wheel build through pip and scikit-build-core (not an editable install).
"$venv/bin/pip" install --quiet --upgrade --force-reinstall --no-deps ./python
"$venv/bin/pip" install --quiet numpy pytest
echo "python: wheel built and installed in $(( $(date +%s) - start )) s"

# The installed package, not python/src; its own libclmla, not one named in the environment.
unset CLMLA_LIBRARY PYTHONPATH
if [ -z "${CLMLA_CLI:-}" ] && [ -x build/clmla ]; then
    export CLMLA_CLI="$root/build/clmla"
fi
"$venv/bin/python" -c "import clmla; print('python: clmla', clmla.__version__, 'from', clmla.library_path)"
"$venv/bin/python" -m clmla devices

cd "$root/python"
rc=0
PYTHONDONTWRITEBYTECODE=1 "$venv/bin/python" -m pytest -q -rs -p no:cacheprovider tests || rc=$?
if [ "$rc" = 5 ]; then
    echo "python: pytest collected no tests" >&2
    exit 1
fi
exit "$rc"
