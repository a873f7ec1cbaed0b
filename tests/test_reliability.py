"""Regression tests of reliability under adversarial use: several event
loops in several threads, fork during stop(), stops that wait on each
other, executors whose futures fail, re-entrant Python while the binding
holds a pointer, and the small inconsistencies between the helpers.

The tests that take the `cpu_load` fixture run beside CPU-burning
processes of their own when HWTIMER_TEST_LOAD is set (CI runs them so),
since contention is where the multi-loop and fork failures showed.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import gc
import logging
import math
import os
import subprocess
import sys
import threading
import time
import warnings
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from conftest import (
    DEADLINE,
    LOOP_KINDS,
    collect_until,
    event_loop,
    run_python,
    wait_for,
    wake_fds,
)
from test_lifecycle import FORK_PRELUDE

import hwtimer


@pytest.fixture
def cpu_load() -> Iterator[None]:
    """With HWTIMER_TEST_LOAD=N, N busy processes run for the test's
    duration (each gives up after 120 s on its own, so none outlives a
    killed run by long)."""
    n = int(os.environ.get("HWTIMER_TEST_LOAD", "0") or 0)
    burn = "import time\nend = time.monotonic() + 120\nwhile time.monotonic() < end: pass\n"
    procs = [subprocess.Popen([sys.executable, "-c", burn]) for _ in range(n)]
    try:
        yield
    finally:
        for p in procs:
            p.kill()
            p.wait()


# ---- 1. scope expiries on loops in several threads ----


class SlowCancelTask(asyncio.Task):  # type: ignore[type-arg]
    """A task whose cancel() lets go of the GIL for a while, as one that
    does I/O would: another loop's expiry then runs meanwhile."""

    def cancel(self, *args: Any, **kwargs: Any) -> bool:
        time.sleep(0.005)
        return super().cancel(*args, **kwargs)


def _slow_cancel_factory(loop: asyncio.AbstractEventLoop, coro: Any, **kwargs: Any) -> Any:
    return SlowCancelTask(coro, loop=loop, **kwargs)


@pytest.mark.parametrize("kind", LOOP_KINDS)
def test_scope_expiries_on_loops_in_many_threads(kind: str, cpu_load: None) -> None:
    nloops, nscopes = 4, 60
    outcomes: list[list[str]] = [[] for _ in range(nloops)]
    handler_calls: list[dict[str, Any]] = []
    start = threading.Barrier(nloops)

    async def guarded(i: int) -> str:
        try:
            if i % 2:
                async with hwtimer.timeout(0.02):
                    await asyncio.sleep(3)
            else:
                await hwtimer.wait_for(asyncio.sleep(3), 0.02)
        except TimeoutError:
            return "timed out"
        return "lost"

    async def main() -> list[str]:
        start.wait()
        return list(await asyncio.gather(*(guarded(i) for i in range(nscopes))))

    def run_loop(k: int) -> None:
        with event_loop(kind) as loop:
            loop.set_task_factory(_slow_cancel_factory)
            loop.set_exception_handler(lambda loop, ctx: handler_calls.append(ctx))
            outcomes[k] = loop.run_until_complete(main())

    threads = [threading.Thread(target=run_loop, args=(k,)) for k in range(nloops)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads)
    assert handler_calls == []
    assert all(o == ["timed out"] * nscopes for o in outcomes), outcomes


# ---- 2. Python run while call_later() holds the loop's sink ----


def test_call_later_survives_release_that_frees_its_sink() -> None:
    # A released timeout's task, freed inside call_later(), closes the loop
    # and makes another call_later() drop that loop's sink.
    code = """
    import asyncio, gc, sys, time
    import hwtimer

    timer = hwtimer.HashedWheelTimer(0.01)
    loop1, loop2 = asyncio.new_event_loop(), asyncio.new_event_loop()
    timer.call_later(100, print, loop=loop1).cancel()

    class Closer:
        def __call__(self, timeout):
            pass
        def __del__(self):
            loop1.close()
            timer.call_later(100, print, loop=loop2)  # purges loop1's sink
            gc.collect()  # which is garbage now: the sink and its weakref

    def spin(seconds):  # holds the GIL: the dispatch thread cannot release
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            pass

    sys.setswitchinterval(100)
    spin(1.5)  # loop1's cancelled timeout is processed...
    timer.new_timeout(lambda t: None, 100).cancel()  # ...and released here
    timer.new_timeout(Closer(), 100).cancel()
    spin(1.5)  # this one is processed, not yet released
    gc.collect()
    try:
        timer.call_later(0.01, print, loop=loop1)
    except RuntimeError as e:
        print("refused:", e)
    else:
        print("accepted")
    sys.setswitchinterval(0.005)
    time.sleep(0.1)
    timer.stop()
    loop2.close()
    print("done")
    """
    proc = run_python(code, timeout=60, args=("-X", "dev"))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("refused:"), proc.stdout + proc.stderr
    assert proc.stdout.endswith("done\n")


# ---- 3. fork while another thread waits in stop() ----

#: A timer with three pending timeouts, whose dispatch thread runs a task
#: that sleeps SECONDS, for stop() to wait for.
SLOW_TASK_RUNNING = """
    timer = hwtimer.HashedWheelTimer(0.01)
    pending = [timer.new_timeout(lambda t: None, 60) for _ in range(3)]
    running = threading.Event()
    def slow(t):
        running.set()
        time.sleep(SECONDS)
    timer.new_timeout(slow, 0)
    assert running.wait(10)
"""


def test_fork_while_another_thread_waits_in_stop(cpu_load: None) -> None:
    code = (
        FORK_PRELUDE
        + SLOW_TASK_RUNNING.replace("SECONDS", "1.0")
        + """
    stopped = []
    stopper = threading.Thread(target=lambda: stopped.append(timer.stop()))
    stopper.start()
    time.sleep(0.3)  # the stopper now waits for the slow task
    pid = os.fork()
    if pid == 0:
        try:
            returned = timer.stop()
            check(sorted(map(id, returned)) == sorted(map(id, pending)),
                  "stop() in the child did not return the pending timeouts")
            check(timer.stop() == [], "a second stop() returned timeouts")
        except BaseException:
            import traceback
            traceback.print_exc()
            check(False, "raised (traceback above)")
        os._exit(child_status())
    status = wait_child(pid)
    stopper.join(10)
    assert status == 0, status
    assert stopped == [[]] or len(stopped[0]) == 3, stopped
    print("ok", flush=True)
"""
    )
    for _ in range(2):
        proc = run_python(code, timeout=90)
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout == "ok\n"


# ---- 4. and 6. stops that could never return ----


def test_stops_that_wait_for_each_other_raise() -> None:
    code = """
    import threading, hwtimer
    a, b = hwtimer.HashedWheelTimer(0.01), hwtimer.HashedWheelTimer(0.01)
    both = threading.Barrier(2, timeout=10)
    results = {}
    def stopper(name, other):
        def task(t):
            both.wait()
            try:
                other.stop()
                results[name] = "stopped"
            except RuntimeError as e:
                results[name] = "refused"
        return task
    a.new_timeout(stopper("a", b), 0)
    b.new_timeout(stopper("b", a), 0)
    import time
    end = time.monotonic() + 20
    while len(results) < 2 and time.monotonic() < end:
        time.sleep(0.01)
    a.stop(); b.stop()
    print(sorted(results.values()))
    """
    proc = run_python(code, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "['refused', 'stopped']\n"


@pytest.mark.parametrize(
    "cycle",
    [
        "stop-stop",  # a task of A stops M; a task of M, advanced elsewhere, stops A
        "advance-stop",  # a task of A advances M; a task of M stops A
        "manual-manual",  # two ManualTimers, each advanced in its own thread
    ],
)
def test_waits_for_each_other_through_a_manual_timer_raise(cycle: str) -> None:
    # A ManualTimer's tasks run on the thread that advances it, which
    # stop() and advance() then wait for as stop() waits for a dispatch
    # thread: of two such waits that would wait for each other for ever,
    # the second raises, as between two dispatch threads.
    code = """
    import os, sys, threading, time, hwtimer
    from hwtimer.testing import ManualTimer
    cycle = sys.argv[1]
    m = ManualTimer()
    a = ManualTimer() if cycle == "manual-manual" else hwtimer.HashedWheelTimer(0.01)
    both = threading.Barrier(2, timeout=10)
    results = {}
    def task(name, call):
        def run(t):
            both.wait()
            try:
                call()
                results[name] = "returned"
            except RuntimeError:
                results[name] = "refused"
        return run
    m.new_timeout(task("m", a.stop), 0.001)
    a.new_timeout(task("a", (lambda: m.advance(1)) if cycle == "advance-stop" else m.stop),
                  0.001)
    threads = [threading.Thread(target=m.advance, args=(0.01,), daemon=True)]
    if cycle == "manual-manual":
        threads.append(threading.Thread(target=a.advance, args=(0.01,), daemon=True))
    for thread in threads:
        thread.start()
    end = time.monotonic() + 20
    while len(results) < 2 and time.monotonic() < end:
        time.sleep(0.01)
    print(sorted(results.values()), flush=True)
    if len(results) < 2:
        os._exit(0)  # the threads wait for each other: nothing can stop
    for thread in threads:
        thread.join()
    a.stop(); m.stop()
    """
    proc = run_python(code, timeout=60, argv=(cycle,))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "['refused', 'returned']\n"


def test_a_manual_timer_advanced_by_a_signal_handler_during_a_stop_is_waited_for() -> None:
    # The main thread waits in stop() for A's dispatch thread; a signal
    # handler that this wait runs advances a ManualTimer M, one of whose
    # tasks stops an idle timer (a wait of its own, which ends at once) and
    # the next holds M a while.  M is let go of before the wait for A goes
    # on: a task of A that advances M meanwhile waits for it, and raises no
    # RuntimeError for a cycle that is not there.
    code = """
    import os, signal, threading, time, hwtimer
    from hwtimer.testing import ManualTimer
    a = hwtimer.HashedWheelTimer(0.01)
    idle = hwtimer.HashedWheelTimer(0.01)
    idle.start()
    m = ManualTimer()
    started, stopping, held = threading.Event(), threading.Event(), threading.Event()
    results = []
    def hold(t):
        held.set()
        end = time.monotonic() + 2
        while not results and time.monotonic() < end:
            time.sleep(0.01)
    m.new_timeout(lambda t: idle.stop(), 1)
    m.new_timeout(hold, 1)
    def task(t):
        started.set()
        stopping.wait(10)
        time.sleep(0.1)  # the main thread waits in a.stop()
        os.kill(os.getpid(), signal.SIGUSR1)
        held.wait(10)
        try:
            m.advance(0)
            results.append("advanced")
        except RuntimeError as e:
            results.append(f"refused: {e}")
    signal.signal(signal.SIGUSR1, lambda signum, frame: m.advance(1))
    a.new_timeout(task, 0.001)
    started.wait(10)
    stopping.set()
    a.stop()
    print(results, flush=True)
    m.stop()
    """
    proc = run_python(code, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "['advanced']\n"


def test_stop_on_own_dispatch_thread_outside_a_task_is_refused(
    make_timer: Callable[..., hwtimer.HashedWheelTimer],
) -> None:
    timer = make_timer()
    outcome: list[object] = []
    done = threading.Event()

    class Stopper:
        def __call__(self, timeout: hwtimer.Timeout) -> None:
            pass

        def __del__(self) -> None:  # run on the dispatch thread, after the task
            try:
                outcome.append(timer.stop())
            except RuntimeError as e:
                outcome.append(e)
            done.set()

    timer.new_timeout(Stopper(), 0)
    assert done.wait(DEADLINE)
    assert len(outcome) == 1 and isinstance(outcome[0], RuntimeError), outcome


def test_stop_on_a_dispatch_thread_after_its_run_ended(
    make_timer: Callable[..., hwtimer.HashedWheelTimer],
) -> None:
    # Python code may run on a dispatch thread after its run() has returned
    # (a finalizer, in a collection there; a profile hook), when its timer,
    # and the dispatcher with it, are gone: a stop() of another timer there
    # must not take the thread for the dispatch thread it was (ASan: a
    # write to the freed dispatcher).
    other = make_timer()
    other.start()
    dropped = threading.Event()
    outcome: list[object] = []
    done = threading.Event()

    def profile(frame: Any, event: str, arg: Any) -> None:
        if event != "return" or frame.f_code is not threading.Thread.run.__code__:
            return
        sys.setprofile(None)
        dropped.wait(DEADLINE)
        try:
            outcome.append(other.stop())
        except RuntimeError as e:
            outcome.append(e)
        done.set()

    threading.setprofile(profile)  # for the dispatch thread started here
    try:
        timer = hwtimer.HashedWheelTimer(0.01, thread_name="run-ended")
        timer.start()
    finally:
        threading.setprofile(None)
    timer.stop()
    ref = weakref.ref(timer)
    del timer
    assert collect_until(ref)
    dropped.set()
    assert done.wait(DEADLINE)
    assert outcome == [[]]


# ---- 5. an executor whose future fails ----


class LateFailingExecutor:
    """Accepts work, then fails it after submit() returned, as a process
    pool does with what it cannot pickle."""

    def submit(self, fn: Any, *args: Any) -> concurrent.futures.Future[Any]:
        fut: concurrent.futures.Future[Any] = concurrent.futures.Future()
        threading.Timer(0.01, fut.set_exception, [TypeError("cannot pickle 'Timeout'")]).start()
        return fut


def the_one_task_error(
    timer: hwtimer.HashedWheelTimer, caplog: pytest.LogCaptureFixture
) -> BaseException | None:
    """Schedules a task due now on `timer`, whose executor fails it, waits
    for the one task error counted and logged, and returns the exception
    the "hwtimer" logger's record carries."""
    with caplog.at_level(logging.WARNING, logger="hwtimer"):
        timer.new_timeout(lambda t: None, 0)
        assert wait_for(lambda: timer.stats()["task_errors"] == 1)
        assert wait_for(lambda: len(caplog.records) == 1)
    (record,) = caplog.records
    assert record.name == "hwtimer" and record.exc_info is not None
    return record.exc_info[1]


def test_executor_failure_after_submit_is_logged_and_counted(
    make_timer: Callable[..., hwtimer.HashedWheelTimer], caplog: pytest.LogCaptureFixture
) -> None:
    timer = make_timer(executor=LateFailingExecutor())
    error = the_one_task_error(timer, caplog)
    assert isinstance(error, TypeError)
    assert timer.stats()["expired"] == 1


def test_future_whose_exception_is_not_one_is_a_type_error(
    make_timer: Callable[..., hwtimer.HashedWheelTimer], caplog: pytest.LogCaptureFixture
) -> None:
    # A future-like object whose exception() returns something other than
    # an exception or None: the log says what is wrong, as a TypeError.
    class OddFuture:
        def add_done_callback(self, callback: Callable[[Any], None]) -> None:
            callback(self)

        def exception(self) -> Any:
            return "failed"

    class OddExecutor:
        def submit(self, fn: Any, *args: Any) -> OddFuture:
            return OddFuture()

    error = the_one_task_error(make_timer(executor=OddExecutor()), caplog)
    assert isinstance(error, TypeError), error
    assert "str" in str(error)


def test_one_shot_whose_submission_fails_is_released(
    make_timer: Callable[..., hwtimer.HashedWheelTimer], monkeypatch: pytest.MonkeyPatch
) -> None:
    # The executor never ran it and never will: nothing keeps the Timeout
    # (or its task), and a late run of it is refused.
    monkeypatch.setattr(logging.getLogger("hwtimer"), "disabled", True)  # no record keeps it

    class Task:
        def __call__(self, timeout: hwtimer.Timeout) -> None:
            ran.append(timeout)

    ran: list[hwtimer.Timeout] = []
    futures: list[concurrent.futures.Future[Any]] = []
    calls: list[tuple[Any, ...]] = []

    class HeldExecutor:
        def submit(self, fn: Any, *args: Any) -> concurrent.futures.Future[Any]:
            calls.append((fn, *args))
            futures.append(concurrent.futures.Future())
            return futures[-1]

    timer = make_timer(executor=HeldExecutor())
    task = Task()
    task_ref = weakref.ref(task)
    timer.new_timeout(task, 0)
    del task
    assert wait_for(lambda: futures)
    futures.pop().set_exception(TypeError("cannot pickle 'Timeout'"))
    assert timer.stats()["task_errors"] == 1
    fn, timeout = calls.pop()
    with pytest.raises(RuntimeError, match="once"):
        fn(timeout)
    assert ran == []
    del fn, timeout
    assert collect_until(task_ref)


def test_one_shot_an_executor_drops_goes_with_its_timer() -> None:
    # An executor that takes the callable, drops it and returns a future
    # that never completes: the timeout's run is never taken, and it waits
    # for one in its timer, not in the module, so that the timer, the
    # timeout and its task go when the user lets the timer go.
    class Task:
        def __call__(self, timeout: hwtimer.Timeout) -> None:
            pass

    futures: list[concurrent.futures.Future[Any]] = []

    class DroppingExecutor:
        def submit(self, fn: Any, *args: Any) -> concurrent.futures.Future[Any]:
            futures.append(concurrent.futures.Future())
            return futures[-1]

    timer = hwtimer.HashedWheelTimer(0.01, executor=DroppingExecutor())
    task = Task()
    refs = [weakref.ref(task), weakref.ref(timer)]
    timer.new_timeout(task, 0)
    assert wait_for(lambda: futures)
    assert timer.stop() == []
    del task, timer
    futures.clear()
    assert all(collect_until(ref) for ref in refs)


def test_periodic_whose_submission_fails_ends_as_if_it_raised(
    make_timer: Callable[..., hwtimer.HashedWheelTimer], caplog: pytest.LogCaptureFixture
) -> None:
    # Its task never ran, so nothing re-armed it: it must not stay pending.
    timer = make_timer(executor=LateFailingExecutor())
    with caplog.at_level(logging.WARNING, logger="hwtimer"):
        p = timer.new_periodic(lambda t: None, 0.01)
        assert wait_for(lambda: timer.stats()["task_errors"] == 1)
        assert wait_for(lambda: timer.pending_timeouts() == 0)
    assert p.is_expired() and not p.is_cancelled()
    assert p.cancel() is False
    time.sleep(0.05)  # no second run is submitted
    assert timer.stats()["task_errors"] == 1
    assert timer.stop() == []


def test_periodic_cancelled_while_its_failing_submission_is_out(
    make_timer: Callable[..., hwtimer.HashedWheelTimer],
) -> None:
    submitted = threading.Event()
    futures: list[concurrent.futures.Future[Any]] = []

    class HeldExecutor:
        def submit(self, fn: Any, *args: Any) -> concurrent.futures.Future[Any]:
            futures.append(concurrent.futures.Future())
            submitted.set()
            return futures[-1]

    timer = make_timer(executor=HeldExecutor())
    p = timer.new_periodic(lambda t: None, 0.01)
    assert submitted.wait(DEADLINE)
    assert p.cancel() is True
    futures[0].set_exception(TypeError("cannot pickle 'Timeout'"))
    assert wait_for(lambda: timer.pending_timeouts() == 0)
    assert p.is_cancelled() and timer.stats()["cancelled"] == 1
    assert timer.stop() == []


def test_process_pool_failure_is_logged(
    make_timer: Callable[..., hwtimer.HashedWheelTimer], caplog: pytest.LogCaptureFixture
) -> None:
    # A Timeout cannot be pickled: a process pool's future fails.
    import multiprocessing

    context = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(1, mp_context=context) as pool:
        timer = make_timer(executor=pool)
        with caplog.at_level(logging.WARNING, logger="hwtimer"):
            timer.new_timeout(lambda t: None, 0)
            assert wait_for(lambda: timer.stats()["task_errors"] == 1, timeout=60)
        timer.stop()
    assert any(r.exc_info for r in caplog.records)


def test_executor_cancelled_future_is_logged(
    make_timer: Callable[..., hwtimer.HashedWheelTimer], caplog: pytest.LogCaptureFixture
) -> None:
    class CancellingExecutor:
        def submit(self, fn: Any, *args: Any) -> concurrent.futures.Future[Any]:
            fut: concurrent.futures.Future[Any] = concurrent.futures.Future()
            threading.Timer(0.01, fut.cancel).start()
            return fut

    timer = make_timer(executor=CancellingExecutor())
    with caplog.at_level(logging.WARNING, logger="hwtimer"):
        timer.new_timeout(lambda t: None, 0)
        assert wait_for(lambda: timer.stats()["task_errors"] == 1)


def test_future_that_cannot_be_watched_is_logged_with_why(
    make_timer: Callable[..., hwtimer.HashedWheelTimer], monkeypatch: pytest.MonkeyPatch
) -> None:
    # A future whose add_done_callback() raises: the task ran, but a later
    # failure could not be seen.  That is logged, with the error, also once
    # the logger's level check is cached (no except clause in logging then
    # swallows an exception left pending), and nothing is written as
    # unraisable instead.
    unraisable: list[Any] = []
    monkeypatch.setattr(sys, "unraisablehook", unraisable.append)
    records: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    logger = logging.getLogger("hwtimer")
    handler = Keep()
    logger.addHandler(handler)
    monkeypatch.setattr(logger, "propagate", False)
    try:
        logger.error("before")  # the level check is cached from here

        class UnwatchableFuture:
            def add_done_callback(self, callback: Callable[[Any], None]) -> None:
                raise ValueError("no callbacks here")

        class RunningExecutor:
            def submit(self, fn: Any, *args: Any) -> UnwatchableFuture:
                fn(*args)
                return UnwatchableFuture()

        ran = threading.Event()
        timer = make_timer(executor=RunningExecutor())
        timer.new_timeout(lambda t: ran.set(), 0)
        assert ran.wait(DEADLINE)
        assert wait_for(lambda: len(records) == 2 or unraisable)
    finally:
        logger.removeHandler(handler)
    assert unraisable == []
    record = records[1]
    assert record.getMessage() == "cannot watch an executor's future"
    assert record.levelno == logging.ERROR and record.exc_info is not None
    assert isinstance(record.exc_info[1], ValueError)
    assert timer.stats()["task_errors"] == 0


# ---- 7. a closed loop the timer has delivered to ----


@pytest.mark.parametrize("kind", LOOP_KINDS)
def test_call_later_on_closed_known_loop_is_refused(
    kind: str, make_timer: Callable[..., hwtimer.HashedWheelTimer]
) -> None:
    timer = make_timer()

    async def deliver() -> None:
        fut = asyncio.get_running_loop().create_future()
        timer.call_later(0.01, fut.set_result, None)
        await fut

    with event_loop(kind) as loop:
        loop.run_until_complete(deliver())
    with pytest.raises(RuntimeError):
        timer.call_later(0.01, print, loop=loop)
    assert timer.pending_timeouts() == 0


# ---- 8. a cancel counts at once ----


def test_cancel_counts_at_once(make_timer: Callable[..., hwtimer.HashedWheelTimer]) -> None:
    timer = make_timer(0.001, 512, max_pending_timeouts=1)
    timer.new_timeout(lambda t: None, 0)  # the worker is up and lingering
    time.sleep(0.1)
    for _ in range(2000):
        to = timer.new_timeout(lambda t: None, 60)  # never rejected
        assert to.cancel()
        assert timer.pending_timeouts() == 0
    assert timer.stats()["rejected"] == 0
    assert wait_for(lambda: timer.stats()["cancelled"] == 2000)
    assert timer.stats()["pending"] == 0


# ---- 9. deadlines just under saturation ----


@pytest.mark.parametrize("delay", [9223372035, 9223372000, 9.223372e9, 9223372036])
def test_deadline_saturates_to_inf(
    delay: float, make_timer: Callable[..., hwtimer.HashedWheelTimer]
) -> None:
    timer = make_timer()
    to = timer.new_timeout(lambda t: None, delay)
    assert to.deadline == math.inf or to.deadline >= time.monotonic() + delay - 1
    assert "never" in repr(to) or "later" in repr(to)
    to.cancel()


# ---- 10. a scope entered after it was made ----


@pytest.mark.parametrize("kind", LOOP_KINDS)
@pytest.mark.parametrize(("delay", "late"), [(0.3, 0.6), (1.0, 0.5)])
def test_scope_entered_late_expires_at_when(kind: str, delay: float, late: float) -> None:
    # entered `late` seconds after it was made: it expires at when(), made
    # + delay (at once when that has passed), not `delay` after entry
    async def main() -> tuple[float, float, float]:
        loop = asyncio.get_running_loop()
        cm = hwtimer.timeout(delay)
        await asyncio.sleep(late)
        entered = loop.time()
        try:
            async with cm:
                await asyncio.sleep(5)
        except TimeoutError:
            pass
        return cm.when(), entered, loop.time()

    with event_loop(kind) as loop:
        when, entered, expired = loop.run_until_complete(main())
    assert expired >= when - 0.01
    assert expired - max(when, entered) < 0.25, (when, entered, expired)


# ---- 11. the loop-sink registry under concurrent call_later() ----


class SlowClosedLoop(asyncio.SelectorEventLoop):
    """A loop whose is_closed() lets go of the GIL."""

    def is_closed(self) -> bool:
        time.sleep(0.05)
        return super().is_closed()


def test_concurrent_new_loops_keep_one_sink_each(
    make_timer: Callable[..., hwtimer.HashedWheelTimer],
) -> None:
    timer = make_timer()
    with contextlib.ExitStack() as closing:
        slow = closing.enter_context(event_loop(SlowClosedLoop))
        loops = [closing.enter_context(event_loop()) for _ in range(3)]
        closing.callback(timer.stop)  # first: the loops close after it
        before = wake_fds()
        timer.call_later(100, print, loop=slow).cancel()

        def schedule(loop: asyncio.AbstractEventLoop) -> None:
            timer.call_later(100, print, loop=loop).cancel()

        # several threads at once for each new loop, while the registry's
        # purge lets go of the GIL
        threads = [threading.Thread(target=schedule, args=(lp,)) for _ in range(3) for lp in loops]
        for t in threads:
            t.start()
            time.sleep(0.005)
        for t in threads:
            t.join()
        for lp in loops:  # each loop has its sink: nothing new is made
            schedule(lp)
        assert wake_fds() - before == 1 + len(loops)


# ---- 12. stop() can be interrupted ----


def test_stop_is_interruptible() -> None:
    code = (
        """
    import os, signal, threading, time
    import hwtimer
"""
        + SLOW_TASK_RUNNING.replace("SECONDS", "3")
        + """
    # a shell starts background jobs with SIGINT ignored, and Python then
    # installs no handler: give the child the one an interactive run has
    signal.signal(signal.SIGINT, signal.default_int_handler)
    threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGINT)).start()
    start = time.monotonic()
    try:
        timer.stop()
    except KeyboardInterrupt:
        print("interrupted", time.monotonic() - start < 2)
    returned = timer.stop()
    print(sorted(map(id, returned)) == sorted(map(id, pending)), timer.stop() == [])
    """
    )
    proc = run_python(code, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "interrupted True\nTrue True\n"


# ---- 13. one rule per case ----


@pytest.mark.parametrize("kind", LOOP_KINDS)
def test_bool_and_nan_deadlines(kind: str) -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        # a bool is no number of seconds, and NaN no deadline, everywhere
        for bad, error in ((True, TypeError), (False, TypeError), (float("nan"), ValueError)):
            with pytest.raises(error):
                hwtimer.timeout(bad)
            with pytest.raises(error):
                hwtimer.timeout_at(bad)
            with pytest.raises(error):
                await hwtimer.sleep(bad)
            with pytest.raises(error):
                await hwtimer.wait_for(loop.create_future(), bad)
        nan = float("nan")
        cm = hwtimer.timeout_at(loop.time() + 10)
        async with cm:
            with pytest.raises(ValueError):
                cm.reschedule(nan)
            with pytest.raises(TypeError):
                cm.reschedule(True)
            assert cm.when() is not None and cm.when() > loop.time()

    with event_loop(kind) as loop:
        loop.run_until_complete(main())


def test_empty_thread_name_is_refused() -> None:
    with pytest.raises(ValueError):
        hwtimer.HashedWheelTimer(thread_name="")


def test_negative_max_pending_means_no_limit(
    make_timer: Callable[..., hwtimer.HashedWheelTimer],
) -> None:
    timer = make_timer(max_pending_timeouts=-3)
    assert timer.max_pending_timeouts == 0
    handles = [timer.new_timeout(lambda t: None, 60) for _ in range(10)]
    assert timer.pending_timeouts() == 10
    for h in handles:
        h.cancel()


# ---- 14. a scope binds when it is awaited ----


@pytest.mark.parametrize("kind", LOOP_KINDS)
def test_scope_binds_at_await_time(kind: str) -> None:
    async def main() -> list[str]:
        loop = asyncio.get_running_loop()
        cm = hwtimer.timeout(10)
        aw = cm.__aenter__()  # called in this task...
        outcome: list[str] = []
        done = loop.create_future()

        def drive() -> None:  # ...awaited outside any task
            try:
                aw.send(None)
            except StopIteration:
                outcome.append("bound")
            except RuntimeError:
                outcome.append("refused")
            done.set_result(None)

        loop.call_soon(drive)
        await done
        # driven as a coroutine, inside a task, it enters
        cm2 = hwtimer.timeout(10)
        aw2 = cm2.__aenter__()
        with pytest.raises(StopIteration) as info:
            aw2.send(None)
        assert info.value.value is cm2
        await cm2.__aexit__(None, None, None)
        # throw() and close() behave as on a coroutine that has not started
        aw3 = hwtimer.timeout(10).__aenter__()
        with pytest.raises(ValueError):
            aw3.throw(ValueError("x"))
        hwtimer.timeout(10).__aenter__().close()
        return outcome

    with event_loop(kind) as loop:
        assert loop.run_until_complete(main()) == ["refused"]


def test_an_aenter_awaitable_runs_once() -> None:
    """Awaited, closed or thrown into, the awaitable of __aenter__() is done
    with, as a coroutine is: a second await raises RuntimeError instead of
    handing back a scope it did not enter, whose block would then run with
    no deadline."""

    async def main() -> None:
        def spend_by_await(aw: Any) -> None:
            with pytest.raises(StopIteration):
                aw.send(None)

        def spend_by_close(aw: Any) -> None:
            aw.close()

        def spend_by_throw(aw: Any) -> None:
            with pytest.raises(ValueError):
                aw.throw(ValueError("x"))

        for spend in (spend_by_await, spend_by_close, spend_by_throw):
            cm = hwtimer.timeout(10)
            aw = cm.__aenter__()
            spend(aw)
            with pytest.raises(RuntimeError, match="cannot reuse"):
                aw.send(None)
            if "active" in repr(cm):
                await cm.__aexit__(None, None, None)
            assert "active" not in repr(cm)
        # one refused outside a task is done with too
        cm = hwtimer.timeout(10)
        aw = cm.__aenter__()
        outcome: list[BaseException] = []

        def drive() -> None:
            for _ in range(2):
                try:
                    aw.send(None)
                except (StopIteration, RuntimeError) as exc:
                    outcome.append(exc)

        asyncio.get_running_loop().call_soon(drive)
        await asyncio.sleep(0.01)
        assert [type(exc) for exc in outcome] == [RuntimeError, RuntimeError]
        assert "cannot reuse" in str(outcome[1])
        assert "created" in repr(cm)

    asyncio.run(main())


def test_an_aenter_awaitable_refusing_a_throw_is_not_spent() -> None:
    """A throw() refused with TypeError (what it is given is no exception,
    an instance with a separate value, a tb that is no traceback) throws
    nothing in: a coroutine stays unstarted, and so does the
    awaitable of __aenter__(), whose await then enters the scope."""

    async def main() -> None:
        refused: list[tuple[Any, ...]] = [(1,), (ValueError("x"), 1), (ValueError, None, 5)]
        for args in refused:
            cm = hwtimer.timeout(10)
            aw = cm.__aenter__()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", DeprecationWarning)  # 3.12's for 3 args
                with pytest.raises(TypeError):
                    aw.throw(*args)
            with pytest.raises(StopIteration):
                aw.send(None)
            assert "active" in repr(cm)
            await cm.__aexit__(None, None, None)

    asyncio.run(main())


# ---- 15. a timer the cyclic GC frees ----


class CycleTimer(hwtimer.HashedWheelTimer):
    """A timer that can keep itself alive, so that only the cyclic GC
    frees it."""

    me: hwtimer.HashedWheelTimer


def test_timer_freed_by_the_gc_closes_its_loop_sinks() -> None:
    async def one_timer() -> None:
        timer = CycleTimer(tick_duration=0.001)
        timer.me = timer
        fut = asyncio.get_running_loop().create_future()
        timer.call_later(0.001, fut.set_result, None)
        await fut
        timer.stop()
        del timer
        gc.collect()
        await asyncio.sleep(0.01)  # a closed sink's reader goes in the loop

    async def main() -> tuple[int, int]:
        watched = asyncio.get_running_loop()._selector.get_map()  # type: ignore[attr-defined]
        fds, readers = wake_fds(), len(watched)
        for _ in range(20):
            await one_timer()
        for _ in range(int(DEADLINE / 0.01)):  # the last sinks' readers go
            if len(watched) == readers:
                break
            await asyncio.sleep(0.01)
        return wake_fds() - fds, len(watched) - readers

    with event_loop() as loop:
        # other tests' sinks may close meanwhile: fewer fds, never more
        new_fds, new_readers = loop.run_until_complete(main())
    assert new_fds <= 0 and new_readers == 0, (new_fds, new_readers)


# what the children below share: a timer class whose instances can hold
# themselves, so that only the cyclic GC frees them
GC_PRELUDE = """
    import asyncio, gc, warnings
    import hwtimer

    class CycleTimer(hwtimer.HashedWheelTimer):
        pass
"""


def assert_child_prints_ok(code: str) -> None:
    """Runs GC_PRELUDE + code in a fresh interpreter, which must print "ok"
    and exit cleanly (not crash on freed memory)."""
    proc = run_python(GC_PRELUDE + code, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "ok\n"


def test_sink_registered_after_its_timer_was_collected() -> None:
    assert_child_prints_ok(
        """
    class NoReaderLoop(asyncio.SelectorEventLoop):
        def add_reader(self, *args):
            raise NotImplementedError

    loop = NoReaderLoop()
    timer = CycleTimer(tick_duration=0.01, thread_name="x" * 40)
    timer.me = timer
    # the sink's registration waits for the loop to run
    timer.call_later(10, print, "never", loop=loop).cancel()
    timer.stop()
    del timer
    gc.collect()
    junk = [bytearray(64) for _ in range(10000)]  # over the freed timer
    loop.run_until_complete(asyncio.sleep(0.05))
    loop.close()
    print("ok")
    """
    )


def test_timer_and_loop_in_one_collection() -> None:
    # A collection that clears the loop's sink before the timer (the loop
    # freed) must not have the timer's clear ask that loop anything.
    assert_child_prints_ok(
        """
    warnings.simplefilter("ignore")
    gc.disable()
    timer = CycleTimer(tick_duration=0.01)
    timer.me = timer
    gc.collect(0)  # the timer goes to an older generation than the loop
    loop = asyncio.new_event_loop()
    timer.call_later(10, print, "never", loop=loop)
    timer.stop()
    del timer, loop
    gc.collect()
    print("ok")
    """
    )


def test_running_subclass_with_its_own_del_collected_in_a_cycle() -> None:
    # Its __del__ does not call the base's, so the collection clears the
    # timer still running: its stop() must come before the clear takes
    # what the stop uses (the loop sinks).
    assert_child_prints_ok(
        """
    warnings.simplefilter("ignore")

    class OwnDel(CycleTimer):
        def __del__(self):
            pass

    timer = OwnDel(tick_duration=0.01, thread_name="own-del")
    timer.start()
    timer.me = timer
    del timer
    gc.collect()
    import threading
    assert not [t for t in threading.enumerate() if t.name.startswith("own-del")]
    print("ok")
    """
    )


def test_timer_dropped_while_its_sink_asks_for_a_reader() -> None:
    # add_reader() runs Python, which may drop the last reference to the
    # timer: the sink then has no timer to name its posting thread after.
    assert_child_prints_ok(
        """
    holder = []

    class DroppingLoop(asyncio.SelectorEventLoop):
        def add_reader(self, *args):
            holder.clear()
            gc.collect()
            raise NotImplementedError

    loop = DroppingLoop()
    holder.append(hwtimer.HashedWheelTimer(0.01, thread_name="x" * 40))
    holder[0].call_later(10, print, "never", loop=loop).cancel()
    holder[0].stop()
    junk = [bytearray(64) for _ in range(10000)]
    loop.run_until_complete(asyncio.sleep(0.05))
    loop.close()
    print("ok")
    """
    )


# ---- 16. a start from many threads at once ----

# The first timer with an executor in a process: its start() runs Python
# code (threading's exit hook is registered), where another thread may
# start it too.
START_RACE = """
    import sys, threading
    from concurrent.futures import ThreadPoolExecutor
    import hwtimer

    sys.setswitchinterval(1e-6)
    pool = ThreadPoolExecutor(1)
    timer = hwtimer.HashedWheelTimer(0.01, thread_name="race", executor=pool)
    barrier = threading.Barrier(8)

    def start():
        barrier.wait()
        timer.start()

    threads = [threading.Thread(target=start) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    sys.setswitchinterval(0.005)
    print(sum(t.name == "race-dispatch" for t in threading.enumerate()), flush=True)
    # at exit, the atexit hook stops it (and would spin on a timer that
    # was listed as running twice)
"""


def test_start_from_many_threads_at_once_starts_once() -> None:
    """However the threads interleave, the timer gets one dispatch thread
    and the process exits at once.  One try per process: the race is there
    only for the first executor timer; 40 tries catch it (one in four did)."""
    for attempt in range(40):
        proc = run_python(START_RACE, timeout=60)
        assert (proc.returncode, proc.stdout, proc.stderr) == (0, "1\n", ""), attempt


def _nomemory_task(timeout: Any) -> None:
    pass


@pytest.mark.parametrize(
    "operation",
    ["new_timeout", "new_periodic", "reset", "cancel", "stats", "pending_snapshot"],
)
def test_failed_allocation_leaves_the_timer_as_it_was(operation: str) -> None:
    """Each allocation that an operation makes, failed in turn: the call
    either raises MemoryError and changes nothing (counts, pending, the
    task's references) or completes; the timer then still runs a new
    timeout, and stop() lists what is pending."""
    testcapi = pytest.importorskip("_testcapi")
    if not hasattr(testcapi, "set_nomemory"):
        pytest.skip("this CPython's _testcapi cannot fail allocations")
    task = _nomemory_task
    failures = 0
    for k in range(40):
        timer = hwtimer.testing.ManualTimer()
        held = [timer.new_timeout(task, 100) for _ in range(3)]
        timer.advance(0.002)
        before = timer.stats()
        refs = sys.getrefcount(task)
        call: Callable[[], object] = {
            "new_timeout": lambda new=timer.new_timeout: new(task, 50),
            "new_periodic": lambda new=timer.new_periodic: new(task, 50),
            "reset": lambda reset=held[0].reset: reset(30),
            "cancel": held[0].cancel,
            "stats": timer.stats,
            "pending_snapshot": timer.pending_snapshot,
        }[operation]
        testcapi.set_nomemory(k, k + 1)
        try:
            result = call()
        except MemoryError:
            result = None
        finally:
            testcapi.remove_mem_hooks()
        if result is None and operation not in ("reset", "cancel"):
            failures += 1
            after = timer.stats()
            for key in ("scheduled", "pending", "cancelled", "expired", "rejected"):
                assert after[key] == before[key], (k, key)
            assert sys.getrefcount(task) == refs
            assert not held[0].is_cancelled()
        del result
        ran: list[object] = []
        fresh = timer.new_timeout(ran.append, 0.001)
        timer.advance(0.01)
        assert ran == [fresh]
        left = timer.stop()
        assert set(map(id, held)) - {id(held[0])} <= set(map(id, left))
        assert all(to.is_cancelled() for to in left)
        del held, left, fresh, ran, timer
    if operation in ("stats", "pending_snapshot"):  # the others may reuse freed memory
        assert failures, "no allocation of the call was failed"
