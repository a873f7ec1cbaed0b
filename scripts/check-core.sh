#!/usr/bin/env bash
# check-core.sh: the hwtimer C core (src/hwt.c, src/wheel.c, src/hwt_sys.c) on
# its own, under sanitizers.
#
#   1. tests/c/model_test.c, the core against its reference model on a fake
#      clock (runs of up to 128 timeouts, then wide runs of 12,000, many
#      due in one tick), built with ASan+UBSan (-fno-sanitize-recover=all),
#      then tests/c/edge_test.c, the edges of its arithmetic (deadlines
#      around every level's slot boundaries, delays up to the clock's end
#      and their saturation to never, large start times) and stop() with
#      timeouts in every state, under ASan+UBSan;
#   2. tests/c/fault_test.c, each pthread init of the core failing in
#      turn (the error reported, what was made undone) and a start taken
#      back keeping its timeouts, under ASan+UBSan,
#      tests/c/reset_wake_test.c, a reset made as the worker is about
#      to sleep (held there by its clock read), under ASan+UBSan,
#      tests/c/default_close_test.c, expiries for a closed default sink
#      released, under ASan+UBSan,
#      tests/c/fork_take_test.c, fork() as a consumer takes from a
#      sink (the child finds what it took), under ASan+UBSan,
#      tests/c/fork_stop_test.c, fork() while another thread's stop()
#      waits for the worker (the child's stop() returns what it had yet to
#      sweep), and tests/c/fork_swept_test.c, fork() just after another
#      thread's stop() has swept (the child finds the list where that
#      stop() stored it), under ASan+UBSan;
#   3. tests/c/walk_race_test.c, a walk of the wheel (hwt_timer_soonest)
#      made as the worker is about to sleep, under TSan;
#      tests/c/soonest_reset_test.c, resets made while hwt_timer_soonest
#      walks the wheel (each timeout found once), under TSan;
#      tests/c/pending_bound_test.c, a schedule and a reset of a delivered
#      one-shot racing for the last place under max_pending (never both
#      accepted), under TSan;
#      tests/c/cascade_reset_test.c, resets and cancels from several
#      threads while the worker cascades what they move, on wheels of one
#      and eight buckets (never early, each ended once), under TSan;
#      tests/c/stress_core.c, the real worker thread with concurrent
#      producers, consumers and stop() races, under TSan, then ASan+UBSan;
#      tests/c/close_race_test.c, a sink closed mid-stream, the timer
#      taken back and started again, and periodic take-backs, each among
#      concurrent cancels and resets, under TSan, then ASan+UBSan;
#   4. tests/c/fuzz_core.c under libFuzzer (+ASan+UBSan) for FUZZ_SECONDS,
#      when clang with libFuzzer is there; otherwise a note says it was
#      skipped.
#
# Needs: bash, coreutils, gcc with its sanitizer runtimes (Debian's gcc
# brings libasan, libubsan and libtsan).  For step 4: clang, whose Debian
# package pulls libclang-rt-NN-dev, which holds libFuzzer.  The script
# installs nothing, except that HWTIMER_INSTALL_CLANG=1 lets it run
# `apt-get install -y clang` when clang is missing.
#
# Environment:
#   CC               compiler for steps 1-2 (default gcc)
#   SEED             seed for the model, edge, pending bound, cascade and stress
#                    tests (default: random)
#   MODEL_ITERATIONS model test runs (default: the test's own, 2000)
#   STRESS_ROUNDS    stress rounds per sanitizer (default 6)
#   FUZZ_SECONDS     fuzzing time (default 30; 0 skips the fuzzer)
#   FUZZ_CORPUS      a corpus directory to keep between runs (default: temp)
#   HWTIMER_PORTABLE=1       the portable POSIX backend of src/hwt_sys.c (a
#                            condition variable, a pipe) instead of Linux's
#   HWTIMER_RELATIVE_WAIT=1  with it, the relative timed waits macOS uses
#
# Exits non-zero on the first failure; a fuzzer crash input is kept and its
# path printed.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
work=$(mktemp -d /tmp/hwtimer-core.XXXXXX)
keep_work=0
trap '[ "$keep_work" = 1 ] || rm -rf "$work"' EXIT

CC=${CC:-gcc}
SEED=${SEED:-$(od -An -N4 -tu4 /dev/urandom | tr -d ' ')}
STRESS_ROUNDS=${STRESS_ROUNDS:-6}
FUZZ_SECONDS=${FUZZ_SECONDS:-30}
CFLAGS=(-Wall -Wextra -Werror -O1 -g -pthread -fno-omit-frame-pointer -I"$root/src" -I"$root/tests/c")
CORE=("$root/src/hwt.c" "$root/src/wheel.c" "$root/src/hwt_sys.c")
backend=futex
if [ "${HWTIMER_PORTABLE:-0}" != 0 ]; then
    CFLAGS+=(-DHWTIMER_PORTABLE=1)
    backend=posix
    if [ "${HWTIMER_RELATIVE_WAIT:-0}" != 0 ]; then
        CFLAGS+=(-DHWTIMER_RELATIVE_WAIT=1)
        backend="posix, relative waits"
    fi
fi
ASAN=(-fsanitize=address,undefined -fno-sanitize-recover=all)
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1:strict_string_checks=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
export TSAN_OPTIONS=${TSAN_OPTIONS:-halt_on_error=1:second_deadlock_stack=1}

step() { printf '\n==== check-core: %s\n' "$*"; }

build() { # build OUTPUT SOURCE FLAGS...
    local out=$1 src=$2
    shift 2
    "$CC" "${CFLAGS[@]}" "$@" "$root/tests/c/$src" "${CORE[@]}" -o "$work/$out"
}

step "model test under ASan+UBSan (seed $SEED, $backend backend)"
build model_asan model_test.c "${ASAN[@]}"
timeout 900 "$work/model_asan" "$SEED" ${MODEL_ITERATIONS:+"$MODEL_ITERATIONS"}

step "edge test under ASan+UBSan (seed $SEED, $backend backend)"
build edge_asan edge_test.c "${ASAN[@]}"
timeout 300 "$work/edge_asan" "$SEED"

step "fault test under ASan+UBSan ($backend backend)"
build fault_asan fault_test.c "${ASAN[@]}" -ldl
timeout 300 "$work/fault_asan"

step "reset wake test under ASan+UBSan ($backend backend)"
build reset_asan reset_wake_test.c "${ASAN[@]}" -ldl
timeout 300 "$work/reset_asan"

step "default sink close test under ASan+UBSan ($backend backend)"
build default_close_asan default_close_test.c "${ASAN[@]}"
timeout 60 "$work/default_close_asan"

step "fork take test under ASan+UBSan ($backend backend)"
build fork_take_asan fork_take_test.c "${ASAN[@]}"
timeout 300 "$work/fork_take_asan" 2000

step "fork stop test under ASan+UBSan ($backend backend)"
build fork_stop_asan fork_stop_test.c "${ASAN[@]}" -ldl
timeout 300 "$work/fork_stop_asan"

step "fork swept test under ASan+UBSan ($backend backend)"
build fork_swept_asan fork_swept_test.c "${ASAN[@]}" -ldl
timeout 300 "$work/fork_swept_asan"

step "walk race test under TSan ($backend backend)"
build walk_tsan walk_race_test.c -fsanitize=thread -ldl
timeout 300 "$work/walk_tsan"

step "soonest reset test under TSan ($backend backend)"
build soonest_reset_tsan soonest_reset_test.c -fsanitize=thread
timeout 300 "$work/soonest_reset_tsan"

step "pending bound test under TSan (seed $SEED, $backend backend)"
build pending_bound_tsan pending_bound_test.c -fsanitize=thread
timeout 300 "$work/pending_bound_tsan" "$SEED"

step "cascade reset test under TSan (seed $SEED, $backend backend)"
build cascade_reset_tsan cascade_reset_test.c -fsanitize=thread
timeout 300 "$work/cascade_reset_tsan" "$SEED"

step "stress test under TSan (seed $SEED, $backend backend)"
build stress_tsan stress_core.c -fsanitize=thread
timeout 900 "$work/stress_tsan" "$SEED" "$STRESS_ROUNDS"

step "stress test under ASan+UBSan (seed $SEED, $backend backend)"
build stress_asan stress_core.c "${ASAN[@]}"
timeout 900 "$work/stress_asan" "$SEED" "$STRESS_ROUNDS"

step "close race test under TSan, then ASan+UBSan (seed $SEED, $backend backend)"
build close_race_tsan close_race_test.c -fsanitize=thread
timeout 300 "$work/close_race_tsan" "$SEED" "$STRESS_ROUNDS"
build close_race_asan close_race_test.c "${ASAN[@]}"
timeout 300 "$work/close_race_asan" "$SEED" "$STRESS_ROUNDS"

if [ "$FUZZ_SECONDS" = 0 ]; then
    step "fuzzer skipped (FUZZ_SECONDS=0)"
    exit 0
fi
if ! command -v clang >/dev/null 2>&1 && [ "${HWTIMER_INSTALL_CLANG:-0}" = 1 ]; then
    step "installing clang (HWTIMER_INSTALL_CLANG=1)"
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq clang >/dev/null; } ||
        step "could not install clang"
fi
if ! command -v clang >/dev/null 2>&1; then
    step "fuzzer skipped: no clang (Debian: apt-get install clang, or HWTIMER_INSTALL_CLANG=1)"
    exit 0
fi
printf 'int LLVMFuzzerTestOneInput(const char *d, unsigned long n) { (void)d; (void)n; return 0; }\n' \
    >"$work/probe.c"
if ! clang -fsanitize=fuzzer "$work/probe.c" -o "$work/probe" 2>/dev/null; then
    step "fuzzer skipped: clang has no libFuzzer (Debian: libclang-rt-NN-dev)"
    exit 0
fi

step "fuzzing the core for ${FUZZ_SECONDS}s (libFuzzer, ASan+UBSan)"
clang "${CFLAGS[@]}" -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all \
    "$root/tests/c/fuzz_core.c" "${CORE[@]}" -o "$work/fuzz_core"
corpus=${FUZZ_CORPUS:-$work/corpus}
mkdir -p "$corpus" "$work/artifacts"
if ! timeout $((FUZZ_SECONDS + 300)) "$work/fuzz_core" -max_total_time="$FUZZ_SECONDS" \
    -max_len=4096 -timeout=30 -rss_limit_mb=2048 -print_final_stats=1 \
    -artifact_prefix="$work/artifacts/" "$corpus" >"$work/fuzz.log" 2>&1; then
    keep_work=1
    tail -n 60 "$work/fuzz.log"
    echo "check-core: the fuzzer failed; inputs kept in $work/artifacts/:" >&2
    ls -l "$work/artifacts" >&2
    echo "replay one with: $work/fuzz_core $work/artifacts/<file>" >&2
    exit 1
fi
grep -E '^(Done|stat::number_of_executed_units|#[0-9]+ +DONE)' "$work/fuzz.log" || true
step "the core passed"
