"""timer.stats() and the worker that sleeps when there is nothing to do."""

from __future__ import annotations

import asyncio
import logging
import os
import random
import shutil
import subprocess
import sys
import threading
import time
import weakref

import pytest
from conftest import collect_until, wait_for

import hwtimer

STATS_KEYS = {
    "pending",
    "scheduled",
    "expired",
    "cancelled",
    "rejected",
    "task_errors",
    "ticks",
    "max_expired_per_tick",
    "late_p50",
    "late_p99",
    "late_max",
    "task_time_max",
}


def _thread_file(name: str, what: str) -> str:
    """The text of /proc/self/task/<tid>/`what` of this process's thread
    named `name`."""
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                if f.read().strip() != name:
                    continue
            with open(f"/proc/self/task/{tid}/{what}") as f:
                return f.read()
        except OSError:  # the thread exited meanwhile
            continue
    raise LookupError(f"no thread named {name!r}")


def _switches(name: str) -> dict[str, int]:
    lines = _thread_file(name, "status").splitlines()
    fields = dict(line.split(":", 1) for line in lines if ":" in line)
    return {key: int(fields[f"{key}_ctxt_switches"]) for key in ("voluntary", "nonvoluntary")}


def worker_switches(name: str) -> int:
    """Context switches so far of this process's thread named `name`."""
    return sum(_switches(name).values())


def worker_sleeps(name: str) -> int:
    """Times so far this process's thread named `name` went to sleep (its
    voluntary context switches): a sleeping thread adds none until woken."""
    return _switches(name)["voluntary"]


def worker_cpu_seconds(name: str) -> float:
    """CPU time so far of this process's thread named `name` (utime + stime)."""
    fields = _thread_file(name, "stat").rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_stats_has_every_documented_key(make_timer):
    stats = make_timer().stats()
    assert STATS_KEYS <= stats.keys()
    assert all(stats[k] == 0 for k in STATS_KEYS)


def test_stats_arithmetic_once_settled(make_timer):
    timer = make_timer(0.005, 64)
    fired = 0
    lock = threading.Lock()

    def task(_t):
        nonlocal fired
        with lock:
            fired += 1

    timeouts = [timer.new_timeout(task, 0.001 * (i % 20)) for i in range(100)]
    # some of these may fire before their cancel on a slow machine
    cancelled = sum(t.cancel() for t in timeouts[60:])
    far = [timer.new_timeout(task, 3600) for _ in range(5)]
    assert wait_for(lambda: fired == 100 - cancelled)
    assert wait_for(lambda: timer.stats()["cancelled"] == cancelled)
    s = timer.stats()
    assert s["scheduled"] == 105
    assert s["expired"] == fired == 100 - cancelled
    assert s["pending"] == len(far) == timer.pending_timeouts()
    assert s["scheduled"] == s["pending"] + s["expired"] + s["cancelled"]
    assert s["ticks"] >= 1
    assert 1 <= s["max_expired_per_tick"] <= fired


def test_stop_counts_what_it_cancels(make_timer):
    # stop() cancels what is pending, returned or not (the deadlines of a
    # scope and of sleep() go on on their loop's clock), and counts each in
    # "cancelled", so that the sum still holds after it
    timer = make_timer(0.01, 64)

    async def main():
        timer.new_timeout(str, 100)
        timer.new_periodic(str, 100)
        timer.call_later(100, str)

        async def scoped():
            async with hwtimer.timeout(100, timer=timer):
                await asyncio.sleep(0.1)

        tasks = [
            asyncio.create_task(scoped()),
            asyncio.create_task(hwtimer.sleep(0.1, timer=timer)),
        ]
        await asyncio.sleep(0.01)  # both deadlines are on the timer
        assert timer.stats()["pending"] == 5
        left = timer.stop()
        await asyncio.gather(*tasks)
        return left

    left = asyncio.run(main())
    assert len(left) == 3
    s = timer.stats()
    assert (s["scheduled"], s["pending"], s["expired"], s["cancelled"]) == (5, 0, 0, 5)


def test_stats_count_rejections_and_task_errors(make_timer):
    timer = make_timer(0.005, 8, max_pending_timeouts=3)
    ran = threading.Event()

    def boom(_t):
        raise ValueError("task failed")

    timer.new_timeout(lambda t: None, 3600)
    timer.new_timeout(lambda t: None, 3600)
    # due in 0.5 s, not at once: a pause of one 5 ms tick before the next
    # call would have boom fire first and make room
    timer.new_timeout(boom, 0.5)
    with pytest.raises(hwtimer.RejectedExecutionError):
        timer.new_timeout(lambda t: None, 0)
    assert wait_for(lambda: timer.pending_timeouts() == 2)  # boom fired: room again
    timer.new_timeout(lambda t: ran.set(), 0.02)
    assert ran.wait(10)
    assert wait_for(lambda: timer.stats()["task_errors"] == 1)
    s = timer.stats()
    assert s["rejected"] == 1
    assert s["scheduled"] == 4  # a rejected timeout is not counted as scheduled
    assert s["expired"] == 2  # the failing task counts as expired


def test_a_task_of_a_large_bucket_is_not_pending_while_it_runs(make_timer):
    # A bucket this large is handed over in slices while the worker walks
    # the rest of it: each task's own timeout has expired, so it counts
    # neither in pending_timeouts() nor against max_pending_timeouts, and
    # a task that schedules one new timeout always finds room.
    n = 20_000
    timer = make_timer(0.05, 8, max_pending_timeouts=n)
    first = []
    refused = []
    ran = 0
    done = threading.Event()

    def task(t):
        nonlocal ran
        if not first:
            s = timer.stats()
            first.append((t.is_expired(), timer.pending_timeouts(), s["pending"], s["expired"]))
        try:
            timer.new_timeout(str, 3600)
        except hwtimer.RejectedExecutionError:
            refused.append(timer.pending_timeouts())
        ran += 1
        if ran == n:
            done.set()

    for _ in range(n):
        timer.new_timeout(task, 0.2)
    assert done.wait(60)
    assert refused == []
    expired, pending, stats_pending, stats_expired = first[0]
    assert expired
    assert pending < n and stats_pending < n and stats_expired >= 1


def test_lateness_plausible_against_tick(make_timer):
    tick = 0.01
    timer = make_timer(tick, 64)
    done = threading.Event()
    n = 50

    def task(_t):
        if timer.stats()["expired"] == n:
            done.set()

    for i in range(n):
        timer.new_timeout(task, 0.002 * i)
    assert done.wait(10)
    assert wait_for(lambda: timer.stats()["late_samples"] == n)
    s = timer.stats()
    # never early; late by about a tick, with room for a busy machine
    assert 0 <= s["late_p50"] <= s["late_p99"] <= s["late_max"] < 1.0
    assert s["late_p50"] <= tick + 0.5
    assert 0 <= s["task_time_max"] < 1.0


@pytest.mark.parametrize("n", [1, 2, 3, 101, 102, 202])
def test_lateness_percentiles_are_samples_at_the_lower_rank(n):
    """late_p50 and late_p99 are the samples at rank (n - 1) * q rounded
    down, as the README defines them: over 2 to 101 samples late_p99 is the
    second largest.  Each task here is k microseconds late, k = 0..n-1, in
    batches of at most 64 tasks, all of which the worker times."""
    from hwtimer.testing import ManualTimer

    with ManualTimer(tick_duration=0.001) as timer:
        for first in range(0, n, 64):
            for k in range(first, min(n, first + 64)):
                timer.new_timeout(lambda _t: None, 0.001 - k * 1e-6)
            timer.advance(0.001)
        s = timer.stats()
    assert s["late_samples"] == n
    for key, q in (("late_p50", 0.5), ("late_p99", 0.99)):
        assert s[key] == pytest.approx(int((n - 1) * q) * 1e-6, abs=2e-9), key
    assert s["late_max"] == pytest.approx((n - 1) * 1e-6, abs=2e-9)


def test_a_slow_untimed_task_shows_in_the_lateness_of_the_tasks_after_it(make_timer):
    timer = make_timer(0.01, 64)
    n, slow = 300, 100  # task 100 of the batch runs untimed
    ran = []

    def task(_t):
        ran.append(1)
        if len(ran) == slow:
            time.sleep(0.2)

    for _ in range(n):
        timer.new_timeout(task, 0.05)
    assert wait_for(lambda: len(ran) == n)
    s = timer.stats()
    assert s["late_samples"] + s["untimed_tasks"] == n
    assert s["untimed_tasks"] > 0
    assert s["late_max"] >= 0.2


class _SlowToFree:
    """A task whose release takes 0.2 s (its __del__)."""

    def __call__(self, *_args: object) -> None:
        pass

    def __del__(self) -> None:
        time.sleep(0.2)


def test_a_timeout_freed_between_tasks_shows_in_the_lateness_of_the_next(make_timer):
    # The first timeout's handle is dropped: the wheel's reference is its
    # last, and freeing it frees its task, whose __del__ delays the next
    # task of the batch: that delay is lateness, not the next task's run.
    timer = make_timer(0.01, 64)
    done = threading.Event()
    timer.new_timeout(_SlowToFree(), 0.05)
    timer.new_timeout(lambda _t: done.set(), 0.05)
    assert done.wait(10)
    assert wait_for(lambda: timer.stats()["late_samples"] == 2)
    assert timer.stats()["late_max"] >= 0.2


_COUNT_CLOCK_READS = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <time.h>
static __thread long reads;
int clock_gettime(clockid_t id, struct timespec *ts)
{
    static int (*real)(clockid_t, struct timespec *);
    if (!real)
        real = (int (*)(clockid_t, struct timespec *))dlsym(RTLD_NEXT, "clock_gettime");
    reads++;
    return real(id, ts);
}
long clock_reads(void) { return reads; }
"""

_CLOCK_READS_PER_TASK = """
import ctypes, os, threading, time
import hwtimer
lib = ctypes.PyDLL(os.environ["COUNT_LIB"])  # keeps the GIL
lib.clock_reads.restype = ctypes.c_long
seen = []
done = threading.Event()
N = 40

def task(t):
    seen.append(lib.clock_reads())  # this thread's reads so far
    if len(seen) == N:
        done.set()

timer = hwtimer.HashedWheelTimer(0.05)
timer.new_timeout(lambda t: None, 0)
time.sleep(0.2)
for _ in range(N):
    timer.new_timeout(task, 0.2)  # each handle dropped at once
assert done.wait(30)
timer.stop()
print(*[b - a for a, b in zip(seen, seen[1:])])
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="LD_PRELOAD of clock_gettime")
@pytest.mark.skipif("LD_PRELOAD" in os.environ, reason="a preloaded runtime (a sanitizer's)")
def test_a_timeout_freed_without_its_task_costs_no_clock_read(tmp_path):
    # Timed tasks of a batch run back to back: the read that ends one
    # starts the next.  A dropped handle leaves the wheel's reference the
    # last, but freeing the timeout alone (its task lives on) runs no
    # Python code, so it must not cost the next task a read of its own.
    cc = shutil.which("cc") or shutil.which("gcc")
    if not cc:
        pytest.skip("no C compiler")
    src = tmp_path / "count.c"
    src.write_text(_COUNT_CLOCK_READS)
    lib = tmp_path / "libcount.so"
    subprocess.run(
        [cc, "-shared", "-fPIC", "-O2", "-o", str(lib), str(src), "-ldl"],
        check=True,
        capture_output=True,
        timeout=120,
    )
    env = dict(os.environ, COUNT_LIB=str(lib), LD_PRELOAD=str(lib))
    proc = subprocess.run(
        [sys.executable, "-c", _CLOCK_READS_PER_TASK],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr
    reads = sorted(int(x) for x in proc.stdout.split())
    # a batch cut by a tick in between may read once more where it begins
    assert len(reads) == 39 and reads[len(reads) // 2] == 1, reads


def test_a_failed_tasks_report_shows_in_the_lateness_of_the_task_after_it(make_timer):
    # The logging handler that reports the first task's error delays the
    # next task of the batch: that delay is its lateness.
    class SlowHandler(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            time.sleep(0.2)

    def fail(_t: object) -> None:
        raise ValueError("reported slowly")

    logger = logging.getLogger("hwtimer")
    handler = SlowHandler()
    logger.addHandler(handler)
    try:
        timer = make_timer(0.01, 64)
        done = threading.Event()
        timer.new_timeout(fail, 0.05)
        timer.new_timeout(lambda _t: done.set(), 0.05)
        assert done.wait(10)
        assert wait_for(lambda: timer.stats()["late_samples"] == 2)
    finally:
        logger.removeHandler(handler)
    assert timer.stats()["late_max"] >= 0.2


def test_a_handle_freed_between_callbacks_shows_in_the_lateness_of_the_next(make_timer):
    timer = make_timer(0.01, 64)

    async def main() -> None:
        done = asyncio.Event()
        timer.call_later(0.05, _SlowToFree())
        timer.call_later(0.05, done.set)
        await asyncio.wait_for(done.wait(), 10)

    asyncio.run(main())
    assert wait_for(lambda: timer.stats()["late_samples"] == 2)
    assert timer.stats()["late_max"] >= 0.2


def test_task_time_max_sees_a_slow_task(make_timer):
    timer = make_timer(0.005, 8)
    done = threading.Event()
    timer.new_timeout(lambda t: (time.sleep(0.05), done.set()), 0)
    assert done.wait(10)
    assert wait_for(lambda: timer.stats()["task_time_max"] >= 0.05)


def test_lateness_and_task_time_of_an_executor_are_taken_where_it_runs_the_task(make_timer):
    """With an executor, a task starts when the executor gets to it: the
    lateness runs from the deadline to that start, not to the submit(),
    and the task's time is its run on the executor."""
    started = []
    done = threading.Event()

    class Slow:
        # starts each task 0.2 s after it was submitted, on a thread of its own
        def submit(self, fn, *args):
            threading.Timer(0.2, fn, args).start()

    def task(t):
        started.append(time.monotonic() - t.deadline)
        time.sleep(0.05)
        done.set()

    timer = make_timer(0.01, 64, executor=Slow())
    timer.new_timeout(task, 0.02)
    assert done.wait(10)
    assert wait_for(lambda: timer.stats()["task_time_max"] >= 0.05)
    s = timer.stats()
    assert s["late_samples"] == 1
    assert 0.2 <= s["late_max"] <= started[0] + 1e-6  # read just before the task began


def test_lateness_of_a_call_later_runs_to_the_callbacks_start_in_its_loop(make_timer):
    timer = make_timer(0.01, 64)
    started = []

    async def main() -> None:
        handle = timer.call_later(0.02, lambda: started.append(time.monotonic()))
        time.sleep(0.3)  # the loop is busy when the callback is handed to it
        for _ in range(1000):
            if started:
                break
            await asyncio.sleep(0.01)
        started[0] -= handle.deadline

    asyncio.run(main())
    s = timer.stats()
    assert s["late_samples"] == 1
    assert 0.2 <= s["late_max"] <= started[0] + 1e-6  # read just before the task began


SMALL_STACK_STATS = """
import threading
from hwtimer.testing import ManualTimer

timer = ManualTimer()
for i in range(5000):  # lateness samples to sort
    timer.new_timeout(lambda t: None, 0.001 * (i % 7))
timer.advance(0.01)
threading.stack_size(32768)  # the least Python allows
got = []
thread = threading.Thread(target=lambda: got.append(timer.stats()))
thread.start()
thread.join()
print(got[0]["late_samples"], got[0]["expired"])
timer.stop()
"""


@pytest.mark.skipif("san.so" in os.environ.get("LD_PRELOAD", ""), reason="under a sanitizer")
def test_stats_from_a_thread_with_the_smallest_stack():
    # stats() may be polled from any thread, one made with
    # threading.stack_size() too: it must not need more stack than that
    proc = subprocess.run(
        [sys.executable, "-c", SMALL_STACK_STATS], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    samples, expired = map(int, proc.stdout.split())
    assert 0 < samples <= 4096 and expired == 5000


def test_idle_timer_does_not_wake(make_timer):
    timer = make_timer(0.001, 512, thread_name="hwt-idle-test")
    timer.start()
    time.sleep(0.1)
    before = worker_switches("hwt-idle-test")
    wakeups = timer.stats()["wakeups"]
    time.sleep(1.0)
    # An every-tick worker would switch about 1000 times here.
    assert worker_switches("hwt-idle-test") - before <= 5
    assert timer.stats()["wakeups"] - wakeups <= 5


def test_idle_after_work_blocks_again(make_timer):
    timer = make_timer(0.001, 512, thread_name="hwt-idle-again")
    fired = threading.Event()
    timer.new_timeout(lambda t: fired.set(), 0.01)
    assert fired.wait(10)
    time.sleep(0.05)
    before = worker_switches("hwt-idle-again")
    time.sleep(1.0)
    assert worker_switches("hwt-idle-again") - before <= 5


def test_pending_far_timeout_sleeps_to_its_tick(make_timer):
    # One timeout 2 s away on a 1 ms tick: the worker sleeps to its bucket
    # (once per turn of the 4096-tick wheel), not through 2000 empty ticks.
    timer = make_timer(0.001, 4096, thread_name="hwt-far-test")
    timer.new_timeout(lambda t: None, 2.0)
    time.sleep(0.1)
    before = worker_switches("hwt-far-test")
    time.sleep(1.0)
    assert worker_switches("hwt-far-test") - before <= 5


def test_a_burst_is_in_the_wheel_before_it_falls_due(make_timer):
    # 20,000 timeouts scheduled at once for 30 s from now, beside one that
    # has the worker asleep until then: the worker is woken to take them
    # into the wheel while they are being scheduled, so that fewer than a
    # wake-up's batch (4096) are left for it to link at the deadline, in
    # front of the first task.  Their deadlines alone would not wake it.
    name = "hwt-burst-early"
    timer = make_timer(0.001, 4096, thread_name=name)
    task = lambda t: None  # noqa: E731
    timer.new_timeout(task, 30)
    # taken into the wheel; after a look at its queue a second on, the
    # worker sleeps until that deadline's tick
    time.sleep(1.5)
    sleeps = worker_sleeps(name)
    n = 20_000
    for _ in range(n):
        timer.new_timeout(task, 30)
    assert wait_for(lambda: worker_sleeps(name) > sleeps, timeout=10)
    assert timer.stats()["pending"] == n + 1


def test_stats_count_what_a_sleeping_worker_has_yet_to_take(make_timer):
    # A worker asleep until a far deadline (or for good) takes new timeouts
    # into the wheel only when it wakes, and these do not wake it: one that
    # never falls due, one further away.  stats() still counts them where
    # they go, as pending_snapshot() finds them.
    timer = make_timer(0.01, 64)
    task = lambda t: None  # noqa: E731
    timer.new_timeout(task, 3600)
    assert timer.stats()["pending"] == 1
    time.sleep(0.2)  # the worker plans its sleep to that deadline
    never = timer.new_timeout(task, float("inf"))
    timer.new_timeout(task, 7200)
    stats = timer.stats()
    assert stats["never_due"] == 1
    assert sum(level["timeouts"] for level in stats["levels"]) == 2
    assert never.cancel()
    assert timer.stats()["never_due"] == 0


def test_a_cancelled_timeout_leaves_the_spread_when_cancel_returns(make_timer):
    # A minute-long tick: the worker processes no cancel before the stats()
    # below, which unlinks it itself; the levels count what is pending.
    timer = make_timer(60.0, 64)
    held = [timer.new_timeout(lambda _t: None, 120.0 * (i + 1)) for i in range(6)]
    stats = timer.stats()
    assert sum(level["timeouts"] for level in stats["levels"]) == 6
    assert all(t.cancel() for t in held[:4])
    stats = timer.stats()
    assert stats["pending"] == 2
    assert sum(level["timeouts"] for level in stats["levels"]) == 2


def test_pending_matches_the_spread_while_the_worker_expires(make_timer):
    # One-shot timeouts only: every pending one is on a level or never due,
    # in the same stats() as the count, while the worker expires others.
    timer = make_timer(0.001, 512)
    rnd = random.Random(7)
    for _ in range(5000):
        timer.new_timeout(lambda _t: None, rnd.uniform(0.01, 1.5))
    timer.new_timeout(lambda _t: None, float("inf"))
    mismatches = []
    polls = 0
    end = time.monotonic() + 1.5
    while time.monotonic() < end and len(mismatches) < 5:
        s = timer.stats()
        polls += 1
        spread = sum(level["timeouts"] for level in s["levels"]) + s["never_due"]
        if spread != s["pending"]:
            mismatches.append((s["pending"], spread))
    assert polls > 0
    assert mismatches == []


def test_timeouts_cancelled_at_once_do_not_wake_the_worker(make_timer):
    # The request-timeout pattern: each cancel takes its timeout back before
    # the worker sees it, so nothing queues and nothing is worth a wake-up,
    # however many are scheduled (a wake-up per 4096 schedules once cost the
    # scheduling thread a system call, and the worker a round for nothing).
    timer = make_timer(0.001, 512)
    timer.start()
    time.sleep(0.1)
    task = lambda t: None  # noqa: E731
    wakeups = timer.stats()["wakeups"]
    for _ in range(50_000):
        timer.new_timeout(task, 60).cancel()
    assert timer.stats()["wakeups"] - wakeups <= 3
    assert timer.stats()["cancelled"] == 50_000


def test_timeouts_cancelled_while_queued_still_wake_the_worker(make_timer):
    # Each schedule comes with the cancel of one scheduled 1000 before, not
    # on top of the queue: the cancel cannot take it back, and it stays for
    # the worker.  So such schedules count towards the wake-up that has the
    # worker take its queue in batches of 4096, as any do (on a 1 s tick,
    # nothing else would wake it more than about once a second).  They come
    # in rounds of 5000 with a pause between, for the worker to take what
    # is queued and sleep again: a worker that finds more queued each time
    # it looks never sleeps, and then has no wake-up to count.
    timer = make_timer(1.0, 8)
    timer.start()
    time.sleep(0.1)
    task = lambda t: None  # noqa: E731
    handles = [timer.new_timeout(task, 60) for _ in range(1000)]
    time.sleep(0.1)  # the wake-up for these, counted before the rounds
    wakeups = timer.stats()["wakeups"]
    for i in range(40_000):
        handles[i % 1000].cancel()
        handles[i % 1000] = timer.new_timeout(task, 60)
        if i % 5000 == 4999:
            time.sleep(0.05)
    assert timer.stats()["wakeups"] - wakeups >= 4


def test_many_far_timeouts_do_not_wake_the_worker(make_timer):
    # 100,000 timeouts one to two hours away, a few a year away and some
    # never, on a 64 ms wheel: they fill every bucket of level 0's turns, so
    # a single-level wheel would wake at every tick (about 1000/s, as the
    # every-tick test below shows) or, busy visiting them, never sleep at
    # all; on the levels above it they wait for a cascade that comes every
    # few minutes.
    timer = make_timer(0.001, 64, thread_name="hwt-far-many")
    rng = random.Random(11)
    task = lambda t: None  # noqa: E731
    for _ in range(100_000):
        timer.new_timeout(task, 3600 + 3600 * rng.random())
    for delay in (365 * 86400.0, 1e300, float("inf")):
        timer.new_timeout(task, delay)
    assert wait_for(lambda: timer.stats()["pending"] == 100_003)
    time.sleep(0.2)  # let the worker move them into the wheel and settle
    wakeups = timer.stats()["wakeups"]
    before = worker_switches("hwt-far-many")
    cpu = worker_cpu_seconds("hwt-far-many")
    time.sleep(2.0)
    assert timer.stats()["wakeups"] - wakeups <= 40
    assert worker_switches("hwt-far-many") - before <= 40
    # a single-level wheel spends most of a core here
    assert worker_cpu_seconds("hwt-far-many") - cpu < 0.5
    # stop() finds them on every level
    assert len(timer.stop()) == 100_003


def test_every_tick_mode_wakes_every_tick(monkeypatch, make_timer):
    # The comparison mode the idle benchmark uses, which proves the bound
    # above can fail.
    monkeypatch.setenv("HWTIMER_WAKE_EVERY_TICK", "1")
    timer = make_timer(0.001, 512, thread_name="hwt-every-tick")
    timer.start()
    time.sleep(0.1)
    before = worker_switches("hwt-every-tick")
    time.sleep(1.0)
    assert worker_switches("hwt-every-tick") - before > 100


def test_far_apart_timeouts_fire_on_time_after_long_sleeps(make_timer):
    timer = make_timer(0.01, 8)  # one turn of the wheel is 80 ms
    fired: list[tuple[float, float]] = []
    done = threading.Event()
    delays = [0.05, 0.4, 0.9, 1.5]

    def task(t):
        fired.append((time.monotonic(), t.deadline))
        if len(fired) == len(delays):
            done.set()

    for d in delays:
        timer.new_timeout(task, d)
    assert done.wait(15)
    for now, deadline in fired:
        assert now >= deadline  # never early
        assert now - deadline < 1.0  # and not lost in a long sleep
    assert [d for _, d in fired] == sorted(d for _, d in fired)


def test_early_timeout_scheduled_during_long_sleep_fires_on_time(make_timer):
    timer = make_timer(0.01, 512)
    timer.new_timeout(lambda t: None, 3600)  # the worker now sleeps to its bucket
    time.sleep(0.1)
    fired = threading.Event()
    at: list[float] = []
    t0 = time.monotonic()
    timeout = timer.new_timeout(lambda t: (at.append(time.monotonic()), fired.set()), 0.05)
    assert fired.wait(10)
    assert at[0] >= timeout.deadline >= t0 + 0.05
    assert at[0] - timeout.deadline < 1.0


class _Task:
    """A task that a weakref can watch."""

    def __call__(self, timeout: object) -> None:
        pass


def test_cancel_during_long_sleep_releases_task(make_timer):
    timer = make_timer(0.01, 512)
    task = _Task()
    ref = weakref.ref(task)
    timeout = timer.new_timeout(task, 3600)
    time.sleep(0.05)  # transferred; the worker sleeps for a long time
    assert timeout.cancel()
    del task, timeout
    assert collect_until(ref)
    assert wait_for(lambda: timer.pending_timeouts() == 0)


def test_a_reset_queued_before_a_long_sleeps_first_cancel_does_not_keep_its_task(make_timer):
    """A reset to a deadline past the worker's wake is queued for it and
    wakes nothing; the first cancel after it is still the sleep's first,
    and wakes the worker, which lets go of the task at once rather than at
    the end of its sleep, an hour away."""
    timer = make_timer(0.01, 512)
    task = _Task()
    ref = weakref.ref(task)
    moved = timer.new_timeout(lambda t: None, 3600)
    cancelled = timer.new_timeout(task, 3600)
    del task
    # transferred, and past the worker's first second, within which the
    # first cancel would not wake it: it sleeps for an hour
    time.sleep(1.5)
    assert moved.reset(4000)
    assert cancelled.cancel()
    began = time.monotonic()
    del cancelled
    assert collect_until(ref)
    # at once, with room for a busy machine (before, only after the hour)
    assert time.monotonic() - began < 5.0
    assert moved.cancel()


def test_cancels_soon_after_a_cancel_wake_are_let_go_within_about_a_second(make_timer):
    """The first cancel of a long sleep wakes the worker; the next ones,
    within the second after, do not, but the worker sleeps no longer
    than to that second's end, so their tasks are let go of then."""
    timer = make_timer(0.01, 512)
    tasks = [_Task() for _ in range(3)]
    refs = [weakref.ref(task) for task in tasks]
    timeouts = [timer.new_timeout(task, 3600) for task in tasks]
    del tasks
    time.sleep(0.05)  # transferred; the worker sleeps for an hour
    while timeouts:
        assert timeouts.pop().cancel()
        began = time.monotonic()
        assert collect_until(refs.pop())
        # the end of the second after the wake, with room for a busy machine
        assert time.monotonic() - began < 5.0
    assert timer.stats()["cancelled"] == 3
