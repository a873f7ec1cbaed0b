# lib-dist.sh: what check-dist.sh and check-abi3.sh share, sourced by both:
# a work directory removed at exit, their steps and failures, and the
# CPythons the machine has.  $1 names the script, in /tmp and in messages.
work=$(mktemp -d "/tmp/hwtimer-$1.XXXXXX")
trap 'rm -rf "$work"' EXIT
export PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONDONTWRITEBYTECODE=1
script_name=check-$1

step() { printf '\n---- %s\n' "$*"; }
fail() {
    printf '%s: %s\n' "$script_name" "$*" >&2
    exit 1
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
