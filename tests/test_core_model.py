"""The C core on its own: builds tests/c/model_test.c (the core against a
reference model, on a fake clock), tests/c/stress_core.c (the real
worker thread under concurrent producers and stop races) and
tests/c/fault_test.c (each pthread init failing in turn) with the system C
compiler, warnings as errors, and runs them, on each backend of
src/hwt_sys.c this system can build: Linux's futex one, the portable POSIX
one, and the portable one with the relative timed waits macOS uses; and
checks that the model test catches a wheel that fires early or reorders a
tick when it cascades, and a count that goes wrong past one tick's first
slice.

HWTIMER_MODEL_SEED fixes the model test's seed; otherwise it is random and
a failure prints the command that reproduces it.
"""

from __future__ import annotations

import os
import random
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SRC = ROOT / "src"
CDIR = ROOT / "tests" / "c"
CORE = ("hwt.c", "wheel.c", "hwt_sys.c")
CFLAGS = ["-Wall", "-Wextra", "-Werror", "-O1", "-g", "-pthread"]

# backend name -> its defines
BACKENDS = {
    "futex": [],
    "posix": ["-DHWTIMER_PORTABLE=1"],
    "posix-relative": ["-DHWTIMER_PORTABLE=1", "-DHWTIMER_RELATIVE_WAIT=1"],
}
backends = pytest.mark.parametrize(
    "backend",
    [
        pytest.param(
            name,
            marks=pytest.mark.skipif(
                name == "futex" and not sys.platform.startswith("linux"), reason="Linux only"
            ),
        )
        for name in BACKENDS
    ],
)


def compiler() -> str:
    for name in ("cc", "gcc", "clang"):
        path = shutil.which(name)
        if path:
            return path
    pytest.skip("no C compiler found")


def build(
    tmp_path: Path,
    source: str,
    core: dict[str, Path] | None = None,
    backend: str = "futex",
    flags: tuple[str, ...] = (),
) -> Path:
    """Builds tests/c/`source` with the core on `backend`, `core` naming
    replacements for some of its files, with extra compiler `flags`."""
    if not (SRC / "hwt.c").exists():
        pytest.skip("the C sources are not beside this test (installed elsewhere)")
    core = core or {}
    exe = tmp_path / Path(source).stem
    cmd = [compiler(), *CFLAGS, *flags, *BACKENDS[backend], f"-I{SRC}", f"-I{CDIR}"]
    cmd.append(str(CDIR / source))
    cmd += [str(core.get(name, SRC / name)) for name in CORE]
    cmd += ["-o", str(exe), "-ldl"]  # fault_test.c's dlsym, in libc itself on newer systems
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"{' '.join(cmd)}\n{proc.stdout}{proc.stderr}"
    return exe


def run(args: list[str], timeout: float) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(args, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, (
        f"{' '.join(args)} exited {proc.returncode}\n{proc.stdout[-4000:]}{proc.stderr[-8000:]}"
    )
    return proc


@backends
def test_core_agrees_with_model(tmp_path: Path, backend: str) -> None:
    exe = build(tmp_path, "model_test.c", backend=backend)
    seed = os.environ.get("HWTIMER_MODEL_SEED") or str(random.randrange(2**32))
    proc = run([str(exe), seed], timeout=300)
    assert "runs agree with the model" in proc.stdout


# Patches of the core, each a bug the model test must catch: (what it
# breaks, (the file in src/, [(text, replacement), ...]), a pattern of what
# the mismatch report says).
BROKEN_CORES = {
    "early": (
        "wheel.c",
        [
            (
                "return calc > w->elapsed ? calc : w->elapsed;",
                "return calc - 1 > w->elapsed ? calc - 1 : w->elapsed;",
            )
        ],
        "expired early",
    ),
    "cascade-reorders": (
        "wheel.c",
        [
            ("hwt_link *from = head->next;", "hwt_link *from = head->prev;"),
            ("head->prev->next = NULL;", "head->next->prev = NULL;"),
            ("from = from->next;", "from = from->prev;"),
        ],
        # seen at an expiry, or first by soonest(), which walks the wheel in
        # the order it would expire: two of one deadline out of order
        r"of the same tick|soonest gave item \d+ \(deadline (-?\d+), seq \d+\) "
        r"after item \d+ \(deadline \1,",
    ),
    # the walk a manual timer's collector relies on misses a far level
    "visit-misses-far": (
        "wheel.c",
        [
            (
                "for (uint32_t p = size0(w); p <= cancelled_index(w); p++)\n        if",
                "for (uint32_t p = never_index(w); p <= cancelled_index(w); p++)\n        if",
            )
        ],
        r"visit_held missed item \d+",
    ),
    # ... or gives level 0 twice
    "visit-twice": (
        "wheel.c",
        [
            (
                "for (uint32_t p = size0(w); p <= cancelled_index(w); p++)\n        if",
                "for (uint32_t p = 0; p <= cancelled_index(w); p++)\n        if",
            )
        ],
        r"visit_held gave item \d+ twice",
    ),
    # a tick that expires more than a slice (hwt.c's EXPIRE_FIRST_SLICE)
    # counts the first slice's expiries again at the next slice's end: only
    # the wide runs, hundreds of timeouts due in one tick, reach that
    "slice-counted-twice": (
        "hwt.c",
        [("            counted = t->expiring_once;\n", "")],
        r"hwt_timer_pending \d+, model \d+|stats\.expired \d+, model \d+",
    ),
    # a "delay" periodic's run after an overrun that waited for a later
    # tick keeps the grid of its deadline instead of starting one at its
    # start: the next run comes less than a period after it began
    "catch-up-from-deadline": (
        "hwt.c",
        [
            (
                "if (catch_up && missed == HWT_MISSED_DELAY && start > from)",
                "if (catch_up && missed == HWT_MISSED_DELAY && start < from)",
            )
        ],
        r"rearm of item \d+ (\(period \d+ missed 1,|returned -?\d+, model)",
    ),
}


@pytest.mark.parametrize("bug", sorted(BROKEN_CORES))
def test_model_test_reports_a_mismatch(tmp_path: Path, bug: str) -> None:
    """The harness fails loudly, and says how to fail again: a wheel that
    delivers a tick early, whose cascade reverses the timeouts of one tick,
    or whose walk of all it holds misses a level or repeats one, is caught;
    so is a count that goes wrong only past a slice of one tick's expiries."""
    name, patches, message = BROKEN_CORES[bug]
    source = (SRC / name).read_text()
    for text, replacement in patches:
        # no skip: if the core changed shape, this self-check must be redone
        assert source.count(text) == 1, f"src/{name} no longer holds {text!r}: update {bug!r}"
        source = source.replace(text, replacement)
    broken = tmp_path / name
    broken.write_text(source)
    exe = build(tmp_path, "model_test.c", {name: broken})

    def fails(*args: str) -> str:
        proc = subprocess.run([str(exe), *args], capture_output=True, text=True, timeout=300)
        assert proc.returncode == 1, proc.stdout[-2000:]
        assert "MODEL MISMATCH" in proc.stderr
        assert re.search(message, proc.stderr), proc.stderr[-2000:]
        return proc.stderr

    again = re.search(r"reproduce with: model_test ([\d ]+)", fails("1", "300"))
    assert again, "no command to reproduce the mismatch"
    fails(*again.group(1).split())


@backends
def test_core_under_concurrent_use(tmp_path: Path, backend: str) -> None:
    exe = build(tmp_path, "stress_core.c", backend=backend)
    proc = run([str(exe), str(random.randrange(2**32)), "6"], timeout=600)
    assert "all rounds passed" in proc.stdout


@backends
def test_core_in_close_unstart_and_take_back_races(tmp_path: Path, backend: str) -> None:
    exe = build(tmp_path, "close_race_test.c", backend=backend)
    proc = run([str(exe), str(random.randrange(2**32)), "3"], timeout=300)
    assert "passed" in proc.stdout


@backends
def test_a_reset_wakes_a_worker_about_to_sleep(tmp_path: Path, backend: str) -> None:
    """A reset to a sooner deadline, made after the worker took the timeout
    into the wheel and before it published how long it sleeps, is not left
    waiting until the old deadline."""
    exe = build(tmp_path, "reset_wake_test.c", backend=backend)
    proc = run([str(exe)], timeout=120)
    assert "after its new deadline" in proc.stdout


@backends
def test_expiries_for_a_closed_default_sink_are_released(tmp_path: Path, backend: str) -> None:
    exe = build(tmp_path, "default_close_test.c", backend=backend)
    proc = run([str(exe)], timeout=60)
    assert "are released" in proc.stdout


def tsan_works(tmp_path: Path) -> bool:
    """Whether the C compiler builds and runs a -fsanitize=thread program."""
    src = tmp_path / "probe.c"
    src.write_text("int main(void) { return 0; }\n")
    exe = tmp_path / "probe"
    cmd = [compiler(), "-fsanitize=thread", str(src), "-o", str(exe)]
    try:
        built = subprocess.run(cmd, capture_output=True, timeout=120).returncode == 0
        return built and subprocess.run([str(exe)], capture_output=True, timeout=60).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


@backends
def test_a_walk_while_the_worker_goes_to_sleep_does_not_race(tmp_path: Path, backend: str) -> None:
    """A pending_snapshot() walk that moves queued timeouts into the wheel
    while the worker, having let go of it, plans its sleep: the two share
    nothing that their locks and atomics do not order (TSan checks)."""
    if not tsan_works(tmp_path):
        pytest.skip("the C compiler cannot build with -fsanitize=thread here")
    exe = build(tmp_path, "walk_race_test.c", backend=backend, flags=("-fsanitize=thread",))
    env = dict(os.environ, TSAN_OPTIONS="halt_on_error=1")
    proc = subprocess.run([str(exe)], capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-8000:]
    assert "while the worker went to sleep" in proc.stdout


@backends
def test_a_reset_during_a_walk_is_found_once(tmp_path: Path, backend: str) -> None:
    """A timeout reset from another thread while pending_snapshot()'s walk
    holds the wheel, after the walk met it at its old deadline, is found
    once, not also at its new deadline in place of the next soonest."""
    exe = build(tmp_path, "soonest_reset_test.c", backend=backend)
    proc = run([str(exe)], timeout=120)
    assert "each timeout reported once" in proc.stdout


@backends
def test_a_reset_and_a_schedule_never_both_get_the_last_place(tmp_path: Path, backend: str) -> None:
    """Under max_pending, a reset of a one-shot delivered to its loop (and
    not yet begun: it counts as expired) racing a schedule from another
    thread for the last place: over 20,000 rounds, never are both accepted,
    nor is the pending count ever past the bound."""
    exe = build(tmp_path, "pending_bound_test.c", backend=backend)
    proc = run([str(exe), str(random.randrange(2**32))], timeout=120)
    assert re.search(r"20000 rounds, .* 0 both; pending at most [0-2] of 2", proc.stdout)


@backends
def test_a_fork_finds_what_the_sink_consumer_took(tmp_path: Path, backend: str) -> None:
    """A child of fork() finds a delivered timeout still in the sink or in
    the slot its consumer keeps it in (the dispatch thread's batch, which
    the child's stop() returns), never in neither: hwt_sink_wait fills the
    slot before it lets go of the sink, whose lock fork() takes."""
    exe = build(tmp_path, "fork_take_test.c", backend=backend)
    proc = run([str(exe), "2000"], timeout=120)
    assert "every child found the token" in proc.stdout


@backends
def test_core_reports_system_failures(tmp_path: Path, backend: str) -> None:
    """Each pthread init the core makes fails in turn: hwt_timer_new and
    hwt_sink_init return that error and leave nothing behind, and a fork
    child that cannot remake a timer's condition variables cannot start it."""
    exe = build(tmp_path, "fault_test.c", backend=backend)
    proc = run([str(exe)], timeout=120)
    assert "failure points of hwt_timer_new" in proc.stdout
