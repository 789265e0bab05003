#!/bin/sh
# The version in include/clmla.h is the newest release section of CHANGELOG.md ("## X.Y.Z (date)").
#   sh tests/changelog_version.sh [REPOSITORY_ROOT]
set -eu
root=${1:-.}
v=$(awk '/^#define CLMLA_VERSION_(MAJOR|MINOR|PATCH) / { printf "%s%s", sep, $3; sep = "." }' "$root/include/clmla.h")
c=$(grep -m1 -E '^## [0-9]+\.[0-9]+\.[0-9]+ ' "$root/CHANGELOG.md" | awk '{ print $2 }')
if [ -z "$v" ] || [ "$v" != "$c" ]; then
    echo "FAIL: include/clmla.h says '$v', CHANGELOG.md's newest release section is '${c:-none}'"
    exit 1
fi
echo "version $v: include/clmla.h and CHANGELOG.md agree"
