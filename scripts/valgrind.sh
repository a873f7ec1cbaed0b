#!/usr/bin/env bash
# valgrind.sh: runs a representative part of the pytest suite under
# valgrind's memcheck, to catch invalid reads and writes, uses of
# uninitialised memory and bad frees in the extension without rebuilding
# CPython.
#
# Usage: scripts/valgrind.sh [pytest arguments...]
# Without arguments it runs tests/test_bad_input.py and tests/test_timer.py:
# argument parsing, the timer, timeouts, stop and the dispatch thread.
#
# The extension is built with -O1 -g in a copy of the tree and installed
# into a venv (default /tmp/hwtimer-vg-venv; HWTIMER_VG_VENV overrides).
# PYTHONMALLOC=malloc makes every Python allocation visible to memcheck.
# Errors are judged by stack: one with a frame in hwtimer (its source files
# or _hwtimer*.so) fails the run; one wholly inside CPython and libc (3.11
# has a few, at start-up and finalization) is counted and shown only with
# HWTIMER_VG_VERBOSE=1.  The full report is kept in $HWTIMER_VG_LOG
# (default /tmp/hwtimer-valgrind.log).  Leaks are not checked (CPython does
# not free everything at exit); HWTIMER_VG_LEAKS=1 adds definite leaks,
# judged the same way.
#
# Needs: valgrind (Debian: apt-get install valgrind), gcc, the Python in
# $PYTHON (default python3) with venv and pip, and PyPI for the test extras.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
python=${PYTHON:-python3}
venv=${HWTIMER_VG_VENV:-/tmp/hwtimer-vg-venv}
work=$(mktemp -d /tmp/hwtimer-vg.XXXXXX)
trap 'rm -rf "$work"' EXIT
export PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONDONTWRITEBYTECODE=1

if ! command -v valgrind >/dev/null 2>&1; then
    echo "valgrind.sh: no valgrind (Debian: apt-get install valgrind)" >&2
    exit 1
fi

echo "==== valgrind.sh: building with -O1 -g into $venv"
[ -x "$venv/bin/python" ] || "$python" -m venv "$venv"
tar -C "$root" --exclude=./.git --exclude=./build --exclude='*.so' --exclude='*.egg-info' \
    --exclude=__pycache__ -cf - . | (mkdir "$work/src" && tar -C "$work/src" -xf -)
"$venv/bin/pip" uninstall -q -y hwtimer >/dev/null 2>&1 || true
CC=gcc CFLAGS="-O1 -g -fno-omit-frame-pointer" \
    "$venv/bin/pip" install -q --no-cache-dir "$work/src[test]"

leaks=(--leak-check=no)
if [ "${HWTIMER_VG_LEAKS:-0}" = 1 ]; then
    leaks=(--leak-check=full --show-leak-kinds=definite --errors-for-leak-kinds=definite)
fi
if [ $# -eq 0 ]; then
    set -- -q -p no:cacheprovider "$root/tests/test_bad_input.py" "$root/tests/test_timer.py"
fi
log=${HWTIMER_VG_LOG:-/tmp/hwtimer-valgrind.log}
echo "==== valgrind.sh: pytest $* (memcheck report: $log)"
cd "$work" # import the installed package, not the work tree
status=0
PYTHONMALLOC=malloc valgrind --tool=memcheck --num-callers=50 --log-file="$log" "${leaks[@]}" \
    "$venv/bin/python" -m pytest "$@" || status=$?

# Splits the report into errors and fails on those with a frame of ours.
"$venv/bin/python" - "$log" "${HWTIMER_VG_VERBOSE:-0}" "$root/src" <<'PY' || status=1
import os
import re
import sys

path, verbose, src = sys.argv[1], sys.argv[2] == "1", sys.argv[3]
# memcheck names a frame's file without its directory: every file of src/
sources = sorted(f for f in os.listdir(src) if f.endswith((".c", ".h")))
ours = re.compile(r"_hwtimer[^ ]*\.so|\((%s):|src/" % "|".join(map(re.escape, sources)))
errors, current = [], None
for line in open(path, encoding="utf-8", errors="replace"):
    body = re.sub(r"^==\d+== ?", "", line.rstrip("\n"))
    if current is None:
        if body and not body.startswith(" ") and re.match(
            r"(Invalid|Conditional|Use of|Syscall param|Mismatched|Source and|"
            r"Argument|\d[\d,]* bytes in)", body
        ):
            current = [body]
    elif body:
        current.append(body)
    else:
        errors.append(current)
        current = None
if current:
    errors.append(current)
mine = [e for e in errors if any(ours.search(l) for l in e)]
print(f"==== valgrind.sh: {len(errors)} memcheck errors, {len(mine)} with a hwtimer frame")
for e in mine + (errors if verbose else []):
    print("\n".join(e), end="\n\n")
sys.exit(1 if mine else 0)
PY
exit "$status"
