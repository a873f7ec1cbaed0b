# lib-dist.sh: what check-dist.sh and check-abi3.sh share, sourced by both:
# a work directory removed at exit, their steps and failures, and the
# CPythons the machine has, and their suites run two at a time.  $1 names
# the script, in /tmp and in messages.  Needs bash 5.1 or later (wait -n -p).
work=$(mktemp -d "/tmp/hwtimer-$1.XXXXXX")
trap 'rm -rf "$work"' EXIT
export PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONDONTWRITEBYTECODE=1
script_name=check-$1

step() { printf '\n---- %s\n' "$*"; }
fail() {
    printf '%s: %s\n' "$script_name" "$*" >&2
    exit 1
}

# make_tools PKG...: a venv of the tools the script needs, under $work;
# sets $tools to its bin directory.
make_tools() {
    step "tools"
    python3 -m venv "$work/tools"
    "$work/tools/bin/pip" install -q "$@"
    tools=$work/tools/bin
}

# The CPythons to test: the newest patch release of each 3.N, N >= $1, that
# pyenv has, or python3 alone without pyenv.
pythons() {
    if command -v pyenv >/dev/null 2>&1; then
        local v
        for v in $(pyenv versions --bare | grep -E '^3\.[0-9]+\.[0-9]+$' |
            awk -F. -v min="$1" '$2 >= min {last[$1"."$2]=$0} END {for (k in last) print last[k]}' |
            sort -V); do
            echo "$(pyenv root)/versions/$v/bin/python"
        done
    else
        command -v python3
    fi
}

# each_python JOB PY...: runs `JOB PY` for each interpreter PY, DIST_JOBS
# (default 2) at a time, since a suite run mostly waits on its timers.  Each
# run writes to a log of its own, printed whole when it finishes, so that
# two runs never interleave; once all have finished, fails naming every
# CPython whose run failed.
each_python() {
    local job=$1 py pid i=0
    shift
    local -A names=() logs=()
    local failed=() running=0
    for py in "$@"; do
        i=$((i + 1))
        ("$job" "$py") >"$work/$job-$i.log" 2>&1 &
        pid=$!
        names[$pid]=$("$py" --version)
        logs[$pid]=$work/$job-$i.log
        running=$((running + 1))
        [ "$running" -lt "${DIST_JOBS:-2}" ] || reap_one
    done
    while [ "$running" -gt 0 ]; do
        reap_one
    done
    [ "${#failed[@]}" -eq 0 ] || fail "failed on $(printf '%s, ' "${failed[@]}" | sed 's/, $//')"
}

# Waits for one of each_python's runs, prints its log, and counts it in the
# caller's running and failed.
reap_one() {
    local pid rc=0
    wait -n -p pid || rc=$?
    running=$((running - 1))
    cat "${logs[$pid]}"
    if [ "$rc" -ne 0 ]; then
        printf '%s: %s failed (exit %d)\n' "$script_name" "${names[$pid]}" "$rc"
        failed+=("${names[$pid]}")
    fi
}
