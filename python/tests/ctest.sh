#!/bin/sh
# ctest's python_pytest: the package's pytest suite against the library of a build tree, without
# pip. tests/CMakeLists.txt sets CLMLA_LIBRARY (that libclmla), CLMLA_CLI (that clmla) and
# PYTHONPATH (python/src). The interpreter: $CLMLA_PYTHON, else the first of python3 on PATH and
# Debian's /usr/bin/python3 (where ci/install-deps.sh puts numpy and pytest; a python3 of pyenv or
# conda earlier on PATH may lack them) that imports numpy and pytest. Exit 77 (skipped) when none
# does (Debian: apt-get install python3-numpy python3-pytest).
here=$(cd "$(dirname "$0")" && pwd)
py=""
for candidate in ${CLMLA_PYTHON:-python3 /usr/bin/python3}; do
    if "$candidate" -c "import numpy, pytest" >/dev/null 2>&1; then
        py=$candidate
        break
    fi
done
if [ -z "$py" ]; then
    echo "python_pytest: no python3 here imports numpy and pytest: skipped (apt-get install python3-numpy python3-pytest)"
    exit 77
fi
echo "python_pytest: $py ($("$py" -c 'import sys; print(sys.version.split()[0])'))"
PYTHONDONTWRITEBYTECODE=1 "$py" -m pytest -q -rs -p no:cacheprovider "$here"
rc=$?
if [ "$rc" = 5 ]; then
    echo "python_pytest: pytest collected no tests" >&2
    exit 1
fi
exit "$rc"
