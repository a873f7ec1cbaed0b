#!/usr/bin/env bash
# refleaks.sh: runs tests under a debug build of CPython, which checks the
# C API's rules as it goes (its assertions, PYTHONMALLOC=debug's guard bytes
# and freed-memory fill), and counts references and memory blocks around
# each test, run several times over (pytest-leaks: -R warmups:runs).  A
# test whose every counted run leaves references or blocks behind is
# reported with an "L" and in the summary, and the script fails.
#
# Usage: scripts/refleaks.sh [pytest arguments...]
# Without arguments it runs the files whose tests repeat the same work each
# time (the clock is the test's, or the work ends before the test does),
# on asyncio's own loop only: uvloop's own reference counts drift by dozens
# per loop and per call_soon() in a debug build, with no memory kept, and
# on a loop that cannot watch the fd, the posting thread closes its fd as
# it ends, around the count.  Left out too: the hypothesis tests, whose
# strategies and coverage tags hypothesis keeps in caches that grow from
# run to run, and the metrics tests, since each OpenTelemetry MeterProvider
# keeps 29 references of its own (the exporters are Python over stats(),
# which the timer tests call).
#
# The interpreter is $PYTHON_DBG (default python3-dbg; Debian:
# apt-get install python3-dbg, which HWTIMER_INSTALL_DBG=1 lets the script
# run).  The venv is /tmp/hwtimer-dbg-venv (HWTIMER_DBG_VENV overrides),
# kept between runs; the package is built into it afresh each time.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
python=${PYTHON_DBG:-python3-dbg}
venv=${HWTIMER_DBG_VENV:-/tmp/hwtimer-dbg-venv}
export PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONDONTWRITEBYTECODE=1

if ! command -v "$python" >/dev/null 2>&1 && [ "${HWTIMER_INSTALL_DBG:-0}" = 1 ]; then
    echo "==== refleaks.sh: installing python3-dbg (HWTIMER_INSTALL_DBG=1)"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-dbg >/dev/null
fi
if ! "$python" -c 'import sys; sys.gettotalrefcount' 2>/dev/null; then
    echo "refleaks.sh: $python is not a debug build of CPython (Debian: apt-get install python3-dbg)" >&2
    exit 1
fi

[ -x "$venv/bin/python" ] || "$python" -m venv "$venv"
# a debug build shows every ResourceWarning, pip's own among them
PYTHONWARNINGS=ignore "$venv/bin/pip" uninstall -q -y hwtimer >/dev/null 2>&1 || true
PYTHONWARNINGS=ignore "$venv/bin/pip" install -q --no-cache-dir "$root[test]" pytest-leaks

if [ $# -eq 0 ]; then
    set -- -q -p no:cacheprovider -R 2:3 -k "not uvloop and not no-reader"
    for f in timer manual manual_asyncio snapshot bad_input rearm asyncio; do
        set -- "$@" "$root/tests/test_$f.py"
    done
fi
echo "==== refleaks.sh: $("$venv/bin/python" --version) pytest $*"
cd "$venv" # import the installed package, not the work tree
log=$(mktemp /tmp/hwtimer-refleaks.XXXXXX)
trap 'rm -f "$log"' EXIT
"$venv/bin/python" -m pytest "$@" | tee "$log"
# pytest-leaks reports a leak as an outcome of its own ("N leaked" on the
# last line) and leaves the exit status as it was
if tail -n 1 "$log" | grep -q ' leaked'; then
    echo "refleaks.sh: tests leaked (see the leaks summary above)" >&2
    exit 1
fi
