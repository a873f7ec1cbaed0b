"""hwtimer.testing.ManualTimer: the real wheel in manual mode, on a clock the
test moves.  Netty's cases of test_netty.py rerun here with exact ticks:
a timeout due at d runs at the end of the first tick that ends at or after
d, so at d itself when d is a tick boundary."""

from __future__ import annotations

import gc
import logging
import math
import os
import signal
import threading
import weakref
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from conftest import native_thread_names, run_threads_switching_often
from test_netty import check_rejected_back_to_back

import hwtimer
from hwtimer import Timeout
from hwtimer.testing import ManualTimer, use_timer

SRC = Path(__file__).resolve().parent.parent / "src"


class Recorder:
    """A task that records the timer's clock, and the thread, at each call."""

    def __init__(self, timer: ManualTimer, name: str = "") -> None:
        self.timer = timer
        self.name = name
        self.times: list[float] = []
        self.threads: list[int] = []
        self.calls: list[Timeout] = []

    def __call__(self, timeout: Timeout) -> None:
        self.times.append(self.timer.time())
        self.threads.append(threading.get_ident())
        self.calls.append(timeout)

    @property
    def count(self) -> int:
        return len(self.times)


def noop(timeout: Timeout) -> None:
    pass


@pytest.fixture
def make_manual() -> Iterator[Callable[..., ManualTimer]]:
    timers: list[ManualTimer] = []

    def factory(*args: object, **kwargs: object) -> ManualTimer:
        timer = ManualTimer(*args, **kwargs)
        timers.append(timer)
        return timer

    yield factory
    for timer in timers:
        timer.stop()


@pytest.fixture
def manual(make_manual: Callable[..., ManualTimer]) -> ManualTimer:
    return make_manual()


# ---- what it is ----


def test_a_hashed_wheel_timer_with_the_documented_defaults(manual: ManualTimer) -> None:
    assert isinstance(manual, hwtimer.HashedWheelTimer)
    assert manual.tick_duration == 0.001
    assert manual.ticks_per_wheel == 4096
    assert manual.max_pending_timeouts == 0
    assert manual.time() == 0.0
    assert "ManualTimer" in repr(manual)


def test_constructor_arguments_follow_hashed_wheel_timer(make_manual) -> None:
    timer = make_manual(0.5, 100, max_pending_timeouts=7)
    assert (timer.tick_duration, timer.ticks_per_wheel, timer.max_pending_timeouts) == (0.5, 128, 7)
    with pytest.raises(ValueError):
        ManualTimer(0)
    with pytest.raises(TypeError):
        ManualTimer("fast")
    with pytest.raises(ValueError):
        ManualTimer(0.001, 0)
    with pytest.raises(TypeError):
        ManualTimer(executor=None)  # no threads, no executor
    with pytest.warns(RuntimeWarning):
        assert make_manual(0.0001).tick_duration == 0.001


def test_clamping_warning_points_at_the_caller() -> None:
    # as for a HashedWheelTimer: at the line that made the timer, not inside
    # hwtimer.testing, so that filters by module and the once-per-line
    # default see the caller's
    with pytest.warns(RuntimeWarning, match="clamped") as warned:
        ManualTimer(0.0001).stop()
    assert [w.filename for w in warned] == [__file__]

    class Sub(ManualTimer):
        pass

    with pytest.warns(RuntimeWarning, match="clamped") as warned:
        Sub(1e-6).stop()
    assert [w.filename for w in warned] == [__file__]


def test_a_subclass_property_that_fails_says_what_is_missing() -> None:
    """An AttributeError raised inside a subclass's property comes out as
    raised, as on any Python object: not as the property missing."""

    class Labelled(ManualTimer):
        @property
        def label(self) -> str:
            return self._label  # type: ignore[attr-defined, no-any-return]

    with Labelled() as timer:
        with pytest.raises(AttributeError, match="'_label'"):
            timer.label  # noqa: B018
        assert timer.task_errors == []


def test_a_subclass_passing_the_defaults_on_gets_them() -> None:
    """A subclass whose __new__ sets its own settings and whose __init__
    hands ManualTimer's __init__ the values it was given: a value equal to
    ManualTimer's default, given, is applied like any other."""

    class Capped(ManualTimer):
        def __new__(cls, limit: int = 3, tick: float = 0.002) -> Capped:
            return super().__new__(cls, tick, 8, max_pending_timeouts=3)

        def __init__(self, limit: int = 3, tick: float = 0.002) -> None:
            super().__init__(tick, 4096, max_pending_timeouts=limit)

    with Capped(0, 0.001) as timer:
        assert timer.max_pending_timeouts == 0
        assert timer.tick_duration == 0.001
        assert timer.ticks_per_wheel == 4096
    with Capped() as timer:
        assert timer.max_pending_timeouts == 3
        assert timer.tick_duration == 0.002


def test_no_threads_and_tasks_run_in_the_calling_thread(manual: ManualTimer) -> None:
    before = sorted(native_thread_names())
    python_threads = threading.active_count()
    task = Recorder(manual)
    manual.new_timeout(task, 0.01)
    assert sorted(native_thread_names()) == before
    assert threading.active_count() == python_threads
    assert manual.advance(1) == 1
    assert task.threads == [threading.get_ident()]

    other = Recorder(manual)
    manual.new_timeout(other, 0.01)
    thread = threading.Thread(target=manual.advance, args=(1,))
    thread.start()
    thread.join()
    assert other.threads == [thread.ident]


def test_repr_of_a_timeout_run_on_its_deadline_says_it_is_past(manual: ManualTimer) -> None:
    timeout = manual.new_timeout(lambda _t: None, 1)
    manual.advance(1)
    assert manual.time() == timeout.deadline
    assert "deadline: 0.000 s ago, expired" in repr(timeout)


def test_clock_moves_only_by_advance(manual: ManualTimer) -> None:
    task = Recorder(manual)
    timeout = manual.new_timeout(task, 0.25)
    assert timeout.deadline == 0.25
    assert "0.250 s later" in repr(timeout)
    assert manual.time() == 0.0
    assert manual.advance(0.1) == 0
    assert manual.time() == 0.1
    assert manual.advance(timedelta(milliseconds=200)) == 1
    assert manual.time() == pytest.approx(0.3)
    assert task.times == [0.25]  # 0.25 ends a tick: it runs there, on time
    assert "ago" in repr(timeout)


class Seconds(float):
    pass


@pytest.mark.parametrize(
    "delay, ns",
    [
        (1.5e-9, 2),  # a part of a ns counts as a whole one: never early
        (5e-324, 1),  # the smallest positive float
        (0.25, 250_000_000),
        (3600.0, 3_600_000_000_000),
        (0.0, 0),
        (-0.5e-9, 0),  # rounded up to now, not before it
        (Seconds(1.5e-9), 2),  # a float subclass takes the general path, alike
        (timedelta(microseconds=1), 1_000),
        (2, 2_000_000_000),
    ],
)
def test_a_delay_is_rounded_up_to_a_whole_ns(manual: ManualTimer, delay: object, ns: int) -> None:
    timeout = manual.new_timeout(Recorder(manual), delay)
    assert timeout.deadline == ns / 1e9
    assert timeout.cancel()


@pytest.mark.parametrize("delay", [9.3e9, 1e300, float("inf")])
def test_a_delay_past_the_clock_s_range_is_never(manual: ManualTimer, delay: float) -> None:
    timeout = manual.new_timeout(Recorder(manual), delay)
    assert timeout.deadline == float("inf")
    assert timeout.cancel()


@pytest.mark.parametrize(
    "seconds, deadline",
    [
        (9_210_000_000, 9.21e9),
        (9_223_372_036, 9_223_372_036.0),  # the last whole second before 2**63 ns
        (9_223_372_037, float("inf")),
    ],
)
def test_a_delay_near_the_clock_s_end_is_the_same_as_int_or_float(
    manual: ManualTimer, seconds: int, deadline: float
) -> None:
    # the same number of seconds, whatever its type, falls due at the same
    # time, or never
    for delay in (seconds, float(seconds), Seconds(seconds), timedelta(seconds=seconds)):
        timeout = manual.new_timeout(Recorder(manual), delay)
        assert (delay, timeout.deadline) == (delay, deadline)
        assert timeout.cancel()


def test_deadlines_count_from_the_clock_at_scheduling(manual: ManualTimer) -> None:
    manual.advance(5)
    task = Recorder(manual)
    timeout = manual.new_timeout(task, 2)
    assert timeout.deadline == 7.0
    manual.advance(1.999)
    assert task.count == 0  # never early
    manual.advance(0.001)
    assert task.times == [7.0]  # 7.0 ends a tick: it runs there


def test_time_reads_each_ticks_end_while_its_tasks_run(make_manual) -> None:
    timer = make_manual(0.1, 8)
    tasks = [Recorder(timer, str(i)) for i in range(4)]
    for i, task in enumerate(tasks):
        timer.new_timeout(task, 0.1 * i + 0.05)
    assert timer.advance(10) == 4
    assert [t.times for t in tasks] == [[0.1], [0.2], [0.3], [0.4]]
    assert timer.time() == 10.0


def test_timeouts_scheduled_by_tasks_run_in_the_same_advance(manual: ManualTimer) -> None:
    times: list[float] = []

    def task(timeout: Timeout) -> None:
        times.append(manual.time())
        if len(times) < 5:
            manual.new_timeout(task, 0.01)

    manual.new_timeout(task, 0.01)
    assert manual.advance(1) == 5
    assert times == pytest.approx([0.01, 0.02, 0.03, 0.04, 0.05])
    assert manual.pending_timeouts() == 0


def test_a_task_scheduled_past_the_new_time_waits(manual: ManualTimer) -> None:
    later = Recorder(manual)
    manual.new_timeout(lambda _: manual.new_timeout(later, 1), 0.5)
    assert manual.advance(1) == 1
    assert later.count == 0 and manual.pending_timeouts() == 1
    assert manual.advance(1) == 1
    assert later.times == [1.5]


def test_a_delay_of_zero_runs_at_the_next_tick(manual: ManualTimer) -> None:
    task = Recorder(manual)
    manual.new_timeout(task, 0)
    manual.new_timeout(task, -5)
    assert manual.advance(0.001) == 2
    assert task.times == [0.001, 0.001]


def test_advance_to_next(make_manual) -> None:
    timer = make_manual(0.01, 16)
    assert timer.advance_to_next() is None
    assert timer.time() == 0.0
    task = Recorder(timer)
    timer.new_timeout(task, 0.5)
    timer.new_timeout(task, 0.5)
    timer.new_timeout(task, 3)  # many turns of the 0.16 s wheel away
    assert timer.advance_to_next() == 0.5
    assert task.times == [0.5, 0.5]
    assert timer.advance_to_next() == 3.0
    assert timer.advance_to_next() is None
    assert timer.time() == 3.0


def test_advance_to_next_skips_cancelled_timeouts(manual: ManualTimer) -> None:
    task = Recorder(manual)
    manual.new_timeout(task, 1).cancel()
    manual.new_timeout(task, 2)
    assert manual.advance_to_next() == 2.0
    assert task.count == 1
    manual.new_timeout(task, 1).cancel()
    assert manual.advance_to_next() is None
    assert manual.time() == 2.0


@pytest.mark.parametrize("delay", [float("inf"), 1e300, 1e12])
def test_advance_to_next_with_only_a_never_due_timeout_pending(
    manual: ManualTimer, delay: float
) -> None:
    """A timeout that never fires (infinite, or past the 64-bit ns clock)
    gives advance_to_next() nothing to move to: None, the clock where it
    was, and the timeout still pending."""
    timeout = manual.new_timeout(lambda t: None, delay)
    manual.advance(0.5)
    assert manual.advance_to_next() is None
    assert manual.time() == 0.5
    assert manual.pending_timeouts() == 1 and not timeout.is_expired()


def test_a_deadline_past_the_clock_of_a_timer_started_late_is_never(manual: ManualTimer) -> None:
    """A timer that starts when its clock reads 100 s: a delay that takes
    the deadline past the 64-bit ns clock only from there on never fires,
    as on a timer started at 0.0 (deadline inf), so advance_to_next() has
    nothing to move to, one-shot, re-armed or periodic."""
    manual.advance(100)
    timeout = manual.new_timeout(noop, 9_223_372_000)
    other = manual.new_timeout(noop, 1)
    assert other.reset(9_223_372_000)
    periodic = manual.new_periodic(noop, 9_223_372_000, delay=0)
    assert manual.advance_to_next() == 100.001  # the periodic's first run
    assert timeout.deadline == other.deadline == periodic.deadline == float("inf")
    assert manual.stats()["never_due"] == 3
    assert manual.advance_to_next() is None
    assert manual.time() == 100.001
    assert manual.pending_timeouts() == 3


def test_a_deadline_whose_tick_ends_past_the_clock_is_never() -> None:
    """With 10 s ticks, a deadline within the 64-bit ns clock whose tick
    would end past it can never run: it reads as never (inf), and
    advance_to_next() has nothing to move to; one a tick earlier runs."""
    manual = ManualTimer(10, 8)
    ran: list[float] = []
    late = manual.new_timeout(lambda t: ran.append(manual.time()), 9_223_372_031)
    last = manual.new_timeout(lambda t: ran.append(manual.time()), 9_223_372_030)
    assert late.deadline == float("inf") and last.deadline == 9_223_372_030
    assert manual.stats()["never_due"] == 1
    while manual.advance_to_next() is not None:
        pass
    assert ran == [9_223_372_030] and last.is_expired() and not late.is_expired()
    assert manual.pending_timeouts() == 1
    manual.stop()


def test_advance_to_next_with_wake_every_tick_set(
    make_manual, monkeypatch: pytest.MonkeyPatch
) -> None:
    # HWTIMER_WAKE_EVERY_TICK makes a worker wake every tick; a ManualTimer
    # has none, and advance_to_next() still goes straight to the timeout,
    # not a tick at a time until it gives up after a million of them
    monkeypatch.setenv("HWTIMER_WAKE_EVERY_TICK", "1")
    timer = make_manual()
    task = Recorder(timer)
    timer.new_timeout(task, 1500)
    assert timer.advance_to_next() == 1500.0
    assert task.times == [1500.0]
    assert timer.advance_to_next() is None


def test_advance_to_next_reaches_a_timeout_however_many_turns_away(
    make_manual: Callable[..., ManualTimer],
) -> None:
    # 8 ms a turn: 10**7 s is over a billion turns away, and one call gets
    # there (the coarse levels bring it down), as the README says
    timer = make_manual(0.001, 8)
    task = Recorder(timer)
    timer.new_timeout(task, 10_000_000)
    assert timer.advance_to_next() == 10_000_000.0
    assert task.times == [10_000_000.0]
    assert timer.advance_to_next() is None


def test_task_errors_are_logged_and_do_not_stop_the_advance(
    manual: ManualTimer, caplog: pytest.LogCaptureFixture
) -> None:
    def boom(timeout: Timeout) -> None:
        raise ValueError("boom")

    after = Recorder(manual)
    manual.new_timeout(boom, 0.01)
    manual.new_timeout(after, 0.02)
    with caplog.at_level(logging.WARNING, logger="hwtimer"):
        assert manual.advance(1) == 2
    assert after.count == 1
    assert manual.stats()["task_errors"] == 1
    assert [type(e) for e in manual.task_errors] == [ValueError]
    assert any(r.exc_info and r.exc_info[0] is ValueError for r in caplog.records)


@pytest.fixture
def sigint_handled() -> Iterator[None]:
    """Python's own SIGINT handler for the test: a process started with
    SIGINT ignored (nohup, a script's background job) would never see the
    Ctrl-C it raises."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def ctrl_c(timeout: Timeout) -> None:
    """A task in which Ctrl-C lands."""
    signal.raise_signal(signal.SIGINT)


@pytest.mark.skipif(not hasattr(signal, "raise_signal"), reason="needs signal.raise_signal")
@pytest.mark.usefixtures("sigint_handled")
def test_ctrl_c_in_a_task_stops_the_advance_after_its_tick(manual: ManualTimer) -> None:
    # Ctrl-C lands in the thread that advances, so in whichever task runs:
    # it comes out of advance() once that tick has run, instead of being
    # taken for the task's error while the advance goes on
    same_tick, later = Recorder(manual), Recorder(manual)
    manual.new_timeout(ctrl_c, 0.01)
    manual.new_timeout(same_tick, 0.01)
    manual.new_timeout(later, 0.02)
    with pytest.raises(KeyboardInterrupt):
        manual.advance(1)
    assert manual.time() == 0.01
    assert same_tick.times == [0.01] and later.count == 0
    assert manual.task_errors == []
    assert manual.advance(1) == 1  # the next advance goes on from there
    assert later.times == [0.02] and manual.time() == 1.01
    manual.new_timeout(ctrl_c, 0.01)
    with pytest.raises(KeyboardInterrupt):
        manual.advance_to_next()
    assert manual.time() == 1.02 and manual.advance_to_next() is None
    manual.new_periodic(ctrl_c, 0.01)
    manual.new_timeout(later, 0.1)
    with pytest.raises(KeyboardInterrupt):
        manual.advance(1)  # stops the periodic one, as any exception of its task
    assert manual.time() == 1.03 and manual.advance(1) == 1
    assert later.count == 2 and manual.pending_timeouts() == 0
    assert manual.task_errors == []


@pytest.mark.skipif(not hasattr(signal, "raise_signal"), reason="needs signal.raise_signal")
@pytest.mark.usefixtures("sigint_handled")
def test_ctrl_c_in_a_task_is_neither_logged_nor_counted_as_its_error(
    manual: ManualTimer, caplog: pytest.LogCaptureFixture
) -> None:
    # Ctrl-C comes out of advance() and is not the task's error: the
    # "hwtimer" logger does not report it as one (one Ctrl-C, one
    # traceback), nor does stats() count it in task_errors
    manual.new_timeout(ctrl_c, 0.01)
    with caplog.at_level(logging.DEBUG, logger="hwtimer"):
        with pytest.raises(KeyboardInterrupt):
            manual.advance(1)
    assert caplog.records == []
    assert manual.stats()["task_errors"] == 0
    assert manual.task_errors == []


@pytest.mark.parametrize("quiet", ["level", "disable", "filter"])
def test_task_errors_are_kept_however_the_logger_is_set(manual: ManualTimer, quiet: str) -> None:
    # a test that quietens hwtimer's warnings still fails on a task's error
    logger = logging.getLogger("hwtimer")
    level = logger.level
    refuse = logging.Filter("nothing")
    if quiet == "level":
        logger.setLevel(logging.ERROR)
    elif quiet == "disable":
        logging.disable(logging.WARNING)
    else:
        logger.addFilter(refuse)
    try:
        manual.new_timeout(lambda t: 1 / 0, 0.01)
        assert manual.advance(1) == 1
    finally:
        logger.setLevel(level)
        logging.disable(logging.NOTSET)
        logger.removeFilter(refuse)
    assert [type(e) for e in manual.task_errors] == [ZeroDivisionError]
    manual.task_errors.clear()


def test_stats_count_exact_ticks_and_lateness(manual: ManualTimer) -> None:
    for _ in range(3):
        manual.new_timeout(noop, 0.0105)
    manual.new_timeout(noop, 5).cancel()
    manual.advance(1)
    stats = manual.stats()
    assert stats["scheduled"] == 4 and stats["expired"] == 3 and stats["cancelled"] == 1
    assert stats["max_expired_per_tick"] == 3
    assert stats["late_max"] == pytest.approx(0.0005)
    assert stats["task_time_max"] == 0.0  # the clock stands still while a task runs
    assert stats["wakeups"] == 0


def test_a_large_batch_times_its_first_64_tasks_then_one_in_64_and_its_last(
    manual: ManualTimer,
) -> None:
    n = 200  # one tick's batch
    for _ in range(n):
        manual.new_timeout(noop, 0.0105)
    manual.advance(0.012)
    stats = manual.stats()
    timed = sum(1 for i in range(n) if i < 64 or i % 64 == 0 or i == n - 1)  # 68
    assert stats["expired"] == n
    assert (stats["late_samples"], stats["untimed_tasks"]) == (timed, n - timed)
    # each timed task's lateness is its own: its start on the clock
    assert stats["late_p50"] == stats["late_max"] == pytest.approx(0.0005)


def test_the_untimed_tasks_of_a_large_batch_fail_refuse_and_keep_as_the_timed_ones(
    manual: ManualTimer, caplog: pytest.LogCaptureFixture
) -> None:
    # Past the 64th task of a batch, most run untimed, by a shorter path:
    # the same errors, the same refusal inside a task, the same cycle safety.
    n = 200
    refused: list[int] = []
    kept: list[Timeout] = []

    def task(timeout: Timeout) -> None:
        i = len(kept)
        kept.append(timeout)  # held past the run: a cycle through `kept` is possible
        if i % 3 == 0:
            try:
                manual.advance(1)
            except RuntimeError as e:
                if "from a task" in str(e):
                    refused.append(i)
        if i % 2:
            raise ValueError(i)

    for _ in range(n):
        manual.new_timeout(task, 0.0105)
    with caplog.at_level(logging.WARNING, logger="hwtimer"):
        assert manual.advance(0.012) == n
    assert manual.stats()["untimed_tasks"] > 0
    assert refused == list(range(0, n, 3))
    assert sorted(e.args[0] for e in manual.task_errors) == list(range(1, n, 2))
    assert manual.stats()["task_errors"] == n // 2
    assert sum(1 for r in caplog.records if r.exc_info) == n // 2
    assert all(gc.is_tracked(t) for t in kept)


def test_huge_delays_never_fire(manual: ManualTimer) -> None:
    task = Recorder(manual)
    a = manual.new_timeout(task, float("inf"))
    b = manual.new_timeout(task, 1e300)
    assert a.deadline == float("inf") and b.deadline == float("inf")
    manual.advance(86400)
    assert task.count == 0
    assert manual.pending_timeouts() == 2


def test_a_done_timeout_lets_go_of_its_task(manual: ManualTimer) -> None:
    class Task:
        def __call__(self, timeout: Timeout) -> None:
            pass

    fired, cancelled = Task(), Task()
    refs = [weakref.ref(fired), weakref.ref(cancelled)]
    manual.new_timeout(fired, 0.01)
    manual.new_timeout(cancelled, 0.01).cancel()
    del fired, cancelled
    manual.advance(0.1)
    gc.collect()
    assert [r() for r in refs] == [None, None]


@pytest.mark.parametrize("end", ["cancel", "stop", "raise"])
def test_an_ended_periodic_lets_go_of_its_task(
    manual: ManualTimer, monkeypatch: pytest.MonkeyPatch, end: str
) -> None:
    """As on the real timer, however a periodic timeout ends; the error of
    one that raised is kept in task_errors (its traceback holds the task)
    until the test clears it."""
    monkeypatch.setattr(logging.getLogger("hwtimer"), "disabled", True)

    class Task:
        def __call__(self, timeout: Timeout) -> None:
            if end == "raise":
                raise ValueError("periodic task failed")

    task = Task()
    ref = weakref.ref(task)
    periodic = manual.new_periodic(task, 0.01)
    del task
    assert manual.advance(0.03) == (1 if end == "raise" else 3)
    if end == "cancel":
        assert periodic.cancel()
        manual.advance(0.001)  # the next tick processes the cancel
    elif end == "stop":
        assert manual.stop() == [periodic]
    else:
        assert periodic.is_expired()
        assert len(manual.task_errors) == 1
        manual.task_errors.clear()
    del periodic
    gc.collect()
    assert ref() is None


def test_advance_reaches_every_deadline_within_the_64_bit_clock(manual: ManualTimer) -> None:
    """The clock goes as far as 64-bit ns allow: advance() reaches a
    timeout due past 9.2e9 s, as advance_to_next() does, and from there
    advance(0) is no error; only the last ns, the core's never, is
    refused."""
    task = Recorder(manual)
    manual.new_timeout(task, 9_210_000_000)
    assert manual.advance(9_210_000_000) == 1
    assert task.times == [9_210_000_000.0]
    assert manual.advance(0) == 0
    manual.advance(13_372_036)  # to 9_223_372_036 s: 2**63 - 1 ns is 0.854775807 s on
    with pytest.raises(ValueError):
        manual.advance(0.854775807)
    assert manual._target(0.854775806) == (2**63 - 2, 0.0, 0.854775806)
    manual.advance(0.854775806)
    assert manual.advance(0) == 0


# ---- bad input: a clear error, the clock unchanged, nothing run ----


@pytest.mark.parametrize(
    "seconds, error",
    [
        (-1, ValueError),
        (-0.001, ValueError),
        (float("nan"), ValueError),
        (float("inf"), ValueError),
        (1e300, ValueError),
        pytest.param(10**400, ValueError, id="int-past-float"),
        pytest.param(-(10**400), ValueError, id="negative-int-past-float"),
        ("1", TypeError),
        (None, TypeError),
        (True, TypeError),
        ([1], TypeError),
    ],
)
def test_advance_rejects_bad_input(manual: ManualTimer, seconds: object, error: type) -> None:
    task = Recorder(manual)
    manual.new_timeout(task, 0)
    manual.advance(0.0005)
    with pytest.raises(error):
        manual.advance(seconds)  # type: ignore[arg-type]
    assert manual.time() == 0.0005
    assert task.count == 0
    assert manual.pending_timeouts() == 1


def test_advance_takes_its_seconds_by_name_as_api_md_writes_it(manual: ManualTimer) -> None:
    """advance(seconds) names its parameter: advance(seconds=...) is the
    same call, and a wrong name or a second value is a TypeError that
    moves nothing."""
    task = Recorder(manual)
    manual.new_timeout(task, 0.0015)
    assert manual.advance(seconds=0.002) == 1
    assert manual.time() == 0.002
    for args, kwargs in [((), {"delay": 1}), ((1,), {"seconds": 1}), ((), {})]:
        with pytest.raises(TypeError, match="advance"):
            manual.advance(*args, **kwargs)  # type: ignore[call-arg, misc]
    assert manual.time() == 0.002


@pytest.mark.parametrize("parts", [3, 7, 3000])
def test_advances_add_up_as_their_seconds_do(manual: ManualTimer, parts: int) -> None:
    """advance(1 / n) n times moves the clock by 1 s, as the seconds add up
    in Python, though 1 / n is no whole number of ns: what is left below a
    ns goes on to the next advance.  A timeout due at 1.0 runs."""
    task = Recorder(manual)
    manual.new_timeout(task, 1.0)
    for _ in range(parts):
        manual.advance(1 / parts)
    assert manual.time() == 1.0
    assert task.count == 1


def test_a_tick_end_leaves_nothing_to_carry(manual: ManualTimer) -> None:
    """advance_to_next() puts the clock at a tick's end, whatever the
    advances before left below a ns."""
    manual.advance(1 / 3)  # a third of a ns left over
    manual.new_timeout(Recorder(manual), 0.5)
    assert manual.advance_to_next() == 0.833333333  # the timer started at 1 / 3
    manual.advance(0.1666666672)  # 0.2 ns over: alone, it rounds down
    assert manual.time() == 1.0


def test_advance_from_inside_its_own_task_is_refused(manual: ManualTimer) -> None:
    errors: list[BaseException] = []
    later = Recorder(manual)

    def task(timeout: Timeout) -> None:
        for call in (lambda: manual.advance(1), manual.advance_to_next):
            try:
                call()
            except RuntimeError as e:
                errors.append(e)

    manual.new_timeout(task, 0.01)
    manual.new_timeout(later, 0.5)
    assert manual.advance(0.1) == 1
    assert len(errors) == 2 and all("task" in str(e) for e in errors)
    assert manual.time() == 0.1
    assert later.count == 0


def test_stop_from_inside_its_own_task_is_refused(manual: ManualTimer) -> None:
    errors: list[BaseException] = []

    def task(timeout: Timeout) -> None:
        try:
            manual.stop()
        except RuntimeError as e:
            errors.append(e)

    manual.new_timeout(task, 0.01)
    manual.advance(0.1)
    assert len(errors) == 1


def test_a_task_may_advance_another_manual_timer(make_manual) -> None:
    outer, inner = make_manual(), make_manual()
    task = Recorder(inner)
    inner.new_timeout(task, 1)
    outer.new_timeout(lambda _: inner.advance(2), 0.01)
    outer.advance(0.1)
    assert task.times == [1.0]


# ---- threads ----


def test_advances_from_several_threads_run_each_task_once(manual: ManualTimer) -> None:
    n = 2000
    counts = [0] * n
    lock = threading.Lock()

    def make_task(i: int) -> Callable[[Timeout], None]:
        def task(timeout: Timeout) -> None:
            with lock:
                counts[i] += 1

        return task

    for i in range(n):
        manual.new_timeout(make_task(i), (i % 100) * 0.01)
    threads = [
        threading.Thread(target=lambda: [manual.advance(0.002) for _ in range(300)])
        for _ in range(4)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert counts == [1] * n
    assert manual.time() == pytest.approx(4 * 300 * 0.002)


def _start_a_held_advance(
    manual: ManualTimer, seconds: float = 1
) -> tuple[threading.Thread, threading.Event, list[object], Timeout]:
    """Starts manual.advance(seconds) in a thread, where a task due at 0.01
    holds it until the event returned is set.  Returns that thread, the
    event, a list the task appends "slow" to as it ends, and a timeout left
    pending after."""
    started, release = threading.Event(), threading.Event()
    finished: list[object] = []

    def slow(timeout: Timeout) -> None:
        started.set()
        release.wait(10)
        finished.append("slow")

    manual.new_timeout(slow, 0.01)
    pending = manual.new_timeout(noop, 5)
    thread = threading.Thread(target=manual.advance, args=(seconds,))
    thread.start()
    assert started.wait(10)
    return thread, release, finished, pending


def _advance_behind(manual: ManualTimer, seconds: float) -> tuple[list[object], threading.Thread]:
    """Calls manual.advance(seconds) in a thread while a held advance holds
    the timer, so that it waits.  Returns a list that gets what it returns
    or raises, and the thread."""
    outcome: list[object] = []

    def advance() -> None:
        try:
            outcome.append(manual.advance(seconds))
        except ValueError as exc:
            outcome.append(exc)

    behind = threading.Thread(target=advance)
    behind.start()
    behind.join(0.2)  # past its reading of the seconds, waiting for `held`
    assert behind.is_alive()
    return outcome, behind


def test_an_advance_that_waited_is_checked_against_the_clock_it_moves(
    manual: ManualTimer,
) -> None:
    # held at 0.01 s until it goes on to 1 s: from 0.01 these seconds keep
    # the clock within 64-bit ns, from 1 s they would wrap it to negative
    held, release, _, pending = _start_a_held_advance(manual)
    outcome, behind = _advance_behind(manual, (2**63 - 0.5e9) / 1e9)
    release.set()
    held.join(10)
    behind.join(10)
    assert [type(o) for o in outcome] == [ValueError]
    assert manual.time() == 1.0
    assert manual.pending_timeouts() == 1 and not pending.is_expired()


def test_advances_that_wait_for_each_other_add_up_as_their_seconds_do(
    manual: ManualTimer, make_manual: Callable[..., ManualTimer]
) -> None:
    """Two advance(1 / 3) from two threads, one waiting for the other, move
    the clock as two in turn do: what is left below a ns goes on from the
    first to the second, though the second read its seconds first."""
    held, release, _, _ = _start_a_held_advance(manual, 1 / 3)
    outcome, behind = _advance_behind(manual, 1 / 3)
    release.set()
    held.join(10)
    behind.join(10)
    in_turn = make_manual()
    in_turn.advance(1 / 3)
    in_turn.advance(1 / 3)
    assert outcome == [0]
    assert manual.time() == in_turn.time() == 0.666666667


def test_stop_waits_for_an_advance_in_another_thread(manual: ManualTimer) -> None:
    thread, release, finished, pending = _start_a_held_advance(manual)
    stopper = threading.Thread(target=lambda: finished.append(len(manual.stop())))
    stopper.start()
    stopper.join(0.05)
    assert stopper.is_alive()  # stop() waits for the task that began
    release.set()
    thread.join()
    stopper.join()
    assert finished == ["slow", 1]
    assert pending.is_cancelled()


@pytest.mark.skipif(not hasattr(signal, "SIGALRM"), reason="needs SIGALRM")
@pytest.mark.parametrize("call", ["stop", "advance"])
def test_a_wait_for_an_advance_in_another_thread_handles_signals(
    manual: ManualTimer, call: str
) -> None:
    # Ctrl-C raises out of the wait, as out of a real timer's stop(), and
    # the wait has changed nothing: the task that began goes on
    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    thread, release, finished, pending = _start_a_held_advance(manual)
    previous = signal.signal(signal.SIGALRM, interrupt)
    try:
        with pytest.raises(KeyboardInterrupt):
            threading.Timer(0.05, os.kill, (os.getpid(), signal.SIGALRM)).start()
            manual.stop() if call == "stop" else manual.advance(1)
        assert finished == []  # out of the wait while the task still runs
    finally:
        signal.signal(signal.SIGALRM, previous)
        release.set()
        thread.join()
    assert manual.time() == 1.0
    assert manual.stop() == [pending]


# ---- use_timer ----


def test_use_timer_in_every_thread(manual: ManualTimer) -> None:
    real = hwtimer.default_timer()
    seen: list[object] = []
    with use_timer(manual) as installed:
        assert installed is manual
        assert hwtimer.default_timer() is manual
        thread = threading.Thread(target=lambda: seen.append(hwtimer.default_timer()))
        thread.start()
        thread.join()
        with use_timer(real):
            assert hwtimer.default_timer() is real
        assert hwtimer.default_timer() is manual
    assert seen == [manual]
    assert hwtimer.default_timer() is real


def test_use_timer_of_one_timer_in_several_threads_at_once(manual: ManualTimer) -> None:
    """Threads that each install the same timer, over and over at the same
    time: every block ends as it began, and the default timer is the
    shared one again once they are done."""
    real = hwtimer.default_timer()
    errors: list[BaseException] = []

    def installs() -> None:
        try:
            for _ in range(2000):
                with use_timer(manual):
                    assert hwtimer.default_timer() is manual
        except BaseException as exc:  # reported by the test, not the thread
            errors.append(exc)

    run_threads_switching_often(installs, 8)
    assert errors == []
    assert hwtimer.default_timer() is real


def test_use_timer_rejects_what_is_not_a_timer() -> None:
    real = hwtimer.default_timer()
    with pytest.raises(TypeError):
        with use_timer("timer"):  # type: ignore[arg-type]
            pass
    assert hwtimer.default_timer() is real


#: Direct reads of CLOCK_MONOTONIC the binding keeps, none of them a
#: deadline's: the loop's clock between a scope's creation and its entry
#: (loop.time() is monotonic; a ManualTimer's scopes skip it), and the
#: real-time wait of stop() for a dispatch thread.
CLOCK_READS_ALLOWED = {"scope.c": 2, "dispatch.c": 1}


def test_the_binding_reads_time_in_one_place() -> None:
    # Manual and real clocks differ only in the core's hwt_config.clock:
    # the binding reads its timers' time through hwtimer_clock_ns().
    for path in SRC.glob("*.c"):
        if path.name.startswith("hwt"):
            continue  # the core
        text = path.read_text()
        reads = sum(
            text.count(d) for d in ("hwt_monotonic_ns(", "clock_gettime(", "CLOCK_MONOTONIC")
        )
        assert reads <= CLOCK_READS_ALLOWED.get(path.name, 0), f"{path.name} reads the clock itself"


# ---- Netty's cases, on exact ticks ----


def test_netty_schedule_timeout_should_not_run_before_delay(make_manual) -> None:
    timer = make_manual(0.1, 512)
    task = Recorder(timer)
    timeout = timer.new_timeout(task, 3)
    timer.advance(2.999)
    assert task.count == 0 and not timeout.is_expired()
    timer.advance(0.001)
    assert task.times == [3.0]
    assert timeout.is_expired()


def test_netty_schedule_timeout_should_run_after_delay(make_manual) -> None:
    timer = make_manual(0.1, 512)
    task = Recorder(timer)
    timeout = timer.new_timeout(task, 0.2)
    assert timer.advance(0.3) == 1
    assert task.times == [0.2]
    assert timeout.is_expired()


def test_netty_stop_timer(make_manual) -> None:
    processed = make_manual()
    for _ in range(3):
        processed.new_timeout(noop, 0.001)
    processed.advance(0.002)
    assert processed.pending_timeouts() == 0
    assert processed.stop() == []

    unprocessed = make_manual()
    timeouts = [unprocessed.new_timeout(noop, 5) for _ in range(5)]
    unprocessed.advance(1)
    returned = unprocessed.stop()
    assert returned == timeouts and all(t.is_cancelled() for t in returned)
    assert unprocessed.stop() == []


def test_netty_timer_should_throw_after_shutdown(make_manual) -> None:
    timer = make_manual()
    task = Recorder(timer)
    timer.new_timeout(task, 0.001)
    timer.stop()
    with pytest.raises(RuntimeError):
        timer.new_timeout(task, 0.001)
    assert timer.advance(1) == 0
    assert task.count == 0


def test_netty_timer_overflow_wheel_length(make_manual) -> None:
    timer = make_manual(0.01, 4)  # one turn: 40 ms
    task = Recorder(timer)

    def again(timeout: Timeout) -> None:
        task(timeout)
        timer.new_timeout(again, 0.1 if task.count < 3 else 60)

    timer.new_timeout(again, 0.1)
    assert timer.advance(1) == 3
    assert task.times == [0.1, 0.2, 0.3]
    assert len(timer.stop()) == 1


def test_netty_execution_on_time(make_manual) -> None:
    timer = make_manual(0.05, 512)
    task = Recorder(timer)
    n = 20000
    for _ in range(n):
        timer.new_timeout(task, 0.125)
    assert timer.advance(0.1) == 0
    assert timer.advance(0.05) == n
    assert set(task.times) == {0.15}
    assert timer.stats()["max_expired_per_tick"] == n


def test_netty_rejected_when_too_many_timeouts(make_manual) -> None:
    check_rejected_back_to_back(make_manual(0.1, 32, max_pending_timeouts=2))


def test_netty_accepted_again_after_one_is_cancelled(make_manual) -> None:
    timer = make_manual(0.1, 32, max_pending_timeouts=2)
    timer.new_timeout(noop, 5)
    timer.new_timeout(noop, 5).cancel()
    timer.advance(0)
    assert timer.pending_timeouts() == 1
    task = Recorder(timer)
    timer.new_timeout(task, 0.09)
    timer.advance(0.1)
    assert task.times == [0.1]


def test_netty_accepted_again_after_one_is_executed(make_manual) -> None:
    timer = make_manual(0.025, 4, max_pending_timeouts=2)
    timer.new_timeout(noop, 5)
    first = Recorder(timer)
    timer.new_timeout(first, 0.09)
    timer.advance(0.1)
    assert first.times == [0.1]
    second = Recorder(timer)
    timer.new_timeout(second, 0.09)
    timer.advance(0.1)
    assert second.times == [0.2]


def test_netty_report_pending_timeouts(make_manual) -> None:
    timer = make_manual(0.1, 512)
    t1 = timer.new_timeout(noop, 6000)
    t2 = timer.new_timeout(noop, 6000)
    timer.new_timeout(noop, 0.09)
    assert timer.pending_timeouts() == 3
    t1.cancel()
    t2.cancel()
    timer.advance(0.1)
    assert timer.pending_timeouts() == 0


@pytest.mark.parametrize("delay", [0.5, 1.0, 4.1])
def test_netty_overflow(make_manual, delay: float) -> None:
    # longer than a turn of the 8-bucket wheel: visited once per turn
    timer = make_manual(0.1, 8)
    task = Recorder(timer)
    timer.new_timeout(task, delay)
    assert timer.advance_to_next() == pytest.approx(delay)
    assert task.times == [pytest.approx(delay)]


def test_netty_cancelled_task_is_never_run(manual: ManualTimer) -> None:
    task = Recorder(manual)
    timeout = manual.new_timeout(task, 0.01)
    assert timeout.cancel()
    assert not timeout.cancel()
    manual.advance(1)
    assert task.count == 0 and timeout.is_cancelled()


def test_never_early_on_every_tick(make_manual) -> None:
    timer = make_manual(0.01, 16)
    late: list[float] = []
    delays = [i * 0.00137 for i in range(500)] + [k * 0.01 for k in range(1, 50)]
    for delay in delays:
        timer.new_timeout(lambda t: late.append(timer.time() - t.deadline), delay)
    timer.advance(1)
    assert len(late) == len(delays)
    assert min(late) == 0  # those on a tick boundary run at it, none before
    assert max(late) <= 0.01 + 1e-9


def test_fifo_within_a_tick(make_manual) -> None:
    timer = make_manual(0.1, 8)
    order: list[int] = []
    for i in range(50):
        # scheduling order, not deadline order, within the tick
        timer.new_timeout(lambda t, i=i: order.append(i), 0.099 - i * 0.001)
    timer.advance(0.1)
    assert order == list(range(50))


def test_a_flood_of_timeouts_due_at_one_tick_all_run_there(manual: ManualTimer) -> None:
    # more than the worker's per-tick transfer (100,000) due at the first
    # tick: a punctual timer has them in their bucket by then (its producers
    # wake the worker to transfer), so all run at that tick, in order
    times: list[float] = []
    order: list[int] = []
    n = 250_000

    def task(timeout: Timeout, i: int) -> None:
        times.append(manual.time())
        order.append(i)

    for i in range(n):
        manual.new_timeout(lambda t, i=i: task(t, i), 0.001)
    assert manual.advance(0.001) == n
    assert set(times) == {0.001} and order == list(range(n))


def test_deadline_tick_order(make_manual) -> None:
    timer = make_manual(0.01, 8)
    order: list[float] = []
    delays = [0.35, 0.05, 0.2, 0.0, 0.11]
    for d in delays:
        timer.new_timeout(lambda t, d=d: order.append(d), d)
    timer.advance(1)
    assert order == sorted(delays)


def test_task_cancels_a_timeout_due_in_the_same_tick(manual: ManualTimer) -> None:
    # A tick's timeouts all expire before its tasks run, as the worker
    # hands them over: the cancel comes too late and both run, once each.
    ran: list[object] = []
    pair: list[Timeout] = []

    def task(timeout: Timeout) -> None:
        ran.append(timeout)
        ran.append((pair[1] if timeout is pair[0] else pair[0]).cancel())

    pair.append(manual.new_timeout(task, 0.0101))
    pair.append(manual.new_timeout(task, 0.0102))
    manual.advance(1)
    assert ran == [pair[0], False, pair[1], False]


def test_task_cancels_a_timeout_of_the_next_tick(manual: ManualTimer) -> None:
    victim = Recorder(manual)
    holder: list[Timeout] = []
    manual.new_timeout(lambda t: holder.append(t.timer.new_timeout(victim, 0)), 0.01)
    manual.new_timeout(lambda t: holder[0].cancel(), 0.01)
    manual.advance(1)
    assert victim.count == 0 and holder[0].is_cancelled()


# ---- periodic timeouts and reset() on the manual clock ----


@pytest.mark.parametrize("missed", ["skip", "delay", "burst"])
def test_advancing_over_n_periods_runs_a_periodic_timeout_n_times(make_manual, missed: str) -> None:
    timer = make_manual(0.01, 16)
    task = Recorder(timer)
    periodic = timer.new_periodic(task, 0.5, missed=missed)
    # API.md: time moves as on a punctual timer, so advancing over n periods
    # runs it n times, each at its deadline (a tick's end)
    assert timer.advance(10) == 20
    assert task.times == pytest.approx([0.5 * k for k in range(1, 21)])
    assert task.calls == [periodic] * 20
    assert timer.advance(0.499) == 0  # never early
    assert timer.advance(0.001) == 1 and task.times[-1] == pytest.approx(10.5)
    assert timer.advance(2.5) == 5 and task.count == 26
    assert not periodic.is_expired() and timer.pending_timeouts() == 1
    assert periodic.cancel()
    assert timer.advance(10) == 0 and task.count == 26


@pytest.mark.parametrize("delay", [0.001, 0.005, 0.25, 3, 7.5])
@pytest.mark.parametrize("start", [0, 1])
def test_a_timeout_of_delay_d_runs_within_advance_d(
    manual: ManualTimer, delay: float, start: float
) -> None:
    # API.md: advance(d) from a tick boundary runs a timeout due d later,
    # with time() reading its deadline; not a tick sooner (far ones too,
    # past a turn of the wheel)
    manual.advance(start)
    task = Recorder(manual)
    timeout = manual.new_timeout(task, delay)
    assert manual.advance(delay - 0.0005) == 0 and task.count == 0
    assert manual.advance(0.0005) == 1
    assert task.times == [pytest.approx(start + delay)]
    assert task.times == [timeout.deadline]
    again = Recorder(manual)
    manual.new_timeout(again, delay)
    assert manual.advance(delay) == 1
    assert again.times == [pytest.approx(start + 2 * delay)]


@pytest.mark.parametrize("delay", [0.067, 1.07, 8.3, timedelta(seconds=8.3)])
def test_a_decimal_delay_is_due_at_its_tick(manual: ManualTimer, delay: float) -> None:
    # delay * 1e9 comes out a hair above a whole ns in floating point for
    # these: that is the product's rounding, not a later deadline, and the
    # timeout is due on the tick boundary that advance(delay) reaches
    seconds = delay.total_seconds() if isinstance(delay, timedelta) else delay
    task = Recorder(manual)
    timeout = manual.new_timeout(task, delay)
    assert timeout.deadline == seconds
    assert manual.advance(delay) == 1
    assert task.times == [seconds]


@pytest.mark.parametrize("period", [0.067, 8.3])
def test_a_decimal_period_does_not_drift_off_its_ticks(manual: ManualTimer, period: float) -> None:
    task = Recorder(manual)
    periodic = manual.new_periodic(task, period)
    assert manual.advance(5 * period) == 5
    assert task.times == pytest.approx([k * period for k in range(1, 6)], abs=1e-9)
    assert periodic.deadline == pytest.approx(6 * period, abs=1e-9)


@pytest.mark.parametrize("missed", ["skip", "delay", "burst"])
def test_a_period_of_a_fraction_of_a_ns_does_not_drift(manual: ManualTimer, missed: str) -> None:
    # 1 / 60 s is 16666666.67 ns: a grid that took each period as a whole
    # ns (rounded up, never early) fell 0.33 ns a run behind start + k *
    # period, 72 us an hour, and advance() over n periods ran it n - 1 times
    period = 1 / 60
    periodic = manual.new_periodic(noop, period, missed=missed)
    assert manual.advance(3600) == 216_000
    assert periodic.deadline == pytest.approx(216_001 * period, abs=2e-9)
    assert manual.advance(3600) == 216_000
    assert periodic.deadline == pytest.approx(432_001 * period, abs=2e-9)


@pytest.mark.parametrize("missed, runs", [("skip", 10), ("delay", 10), ("burst", 100)])
def test_a_period_shorter_than_the_tick(make_manual, missed: str, runs: int) -> None:
    # a tick's end is a period or more past the last run: only "burst"
    # catches up on every grid point, back to back at the tick's end
    timer = make_manual(0.01, 16)
    task = Recorder(timer)
    timer.new_periodic(task, 0.001, missed=missed)
    assert timer.advance(0.1) == runs
    assert sorted(set(task.times)) == pytest.approx([0.01 * k for k in range(1, 11)])


def test_a_periodic_of_infinite_period_runs_once_then_never_falls_due(
    manual: ManualTimer,
) -> None:
    runs: list[float] = []
    periodic = manual.new_periodic(lambda to: runs.append(manual.time()), math.inf, delay=0.01)
    manual.advance(1e6)
    assert runs == [pytest.approx(0.01, abs=0.002)]
    assert periodic.deadline == math.inf
    assert not periodic.is_expired() and not periodic.is_cancelled()
    stats = manual.stats()
    assert (stats["pending"], stats["never_due"]) == (1, 1)
    assert manual.stop() == [periodic]
    assert periodic.is_cancelled()


def test_advance_counts_only_the_periodic_runs_that_happen(make_manual) -> None:
    # a task cancels, another resets, a periodic timeout due in the same
    # tick, after them: neither runs then, and advance() does not count them
    timer = make_manual(0.01, 16)
    task = Recorder(timer)
    doomed, moved = [], []
    timer.new_timeout(lambda to: doomed[0].cancel(), 0.05)
    timer.new_timeout(lambda to: moved[0].reset(1.0), 0.05)
    doomed.append(timer.new_periodic(task, 0.05))
    moved.append(timer.new_periodic(task, 0.05))
    assert timer.advance(0.06) == 2  # the two one-shot tasks
    assert task.calls == []
    assert moved[0].deadline == pytest.approx(1.05)
    assert timer.advance(1.01) == 1  # the moved one, at its new deadline
    assert task.times == [pytest.approx(1.05)]


def test_a_periodic_cancelled_before_its_run_in_the_tick_counts_at_once(make_manual) -> None:
    # due in the tick that runs, after the task that cancels it: once
    # cancel() has returned True it is not pending, so a schedule at
    # max_pending_timeouts is accepted
    timer = make_manual(0.01, 16, max_pending_timeouts=2)
    seen, later = [], []

    def cancel_the_other(to: Timeout) -> None:
        assert other.cancel() is True
        seen.append((timer.pending_timeouts(), timer.stats()["cancelled"]))
        later.append(timer.new_timeout(str, 1))

    first = timer.new_periodic(cancel_the_other, 0.05)
    other = timer.new_periodic(str, 0.05)
    assert timer.advance(0.05) == 1
    assert seen == [(1, 1)] and len(later) == 1
    assert timer.pending_timeouts() == 2
    assert timer.stats()["cancelled"] == 1
    assert sorted(map(id, timer.stop())) == sorted(map(id, [first, later[0]]))


def test_a_periodic_cancelled_in_its_own_run_counts_at_once(make_manual) -> None:
    timer = make_manual(0.01, 16)
    seen = []

    def cancel_itself(to: Timeout) -> None:
        assert to.cancel() is True
        seen.append((timer.pending_timeouts(), timer.stats()["cancelled"]))

    timer.new_periodic(cancel_itself, 0.05)
    assert timer.advance(0.2) == 1
    assert seen == [(0, 1)]
    assert (timer.pending_timeouts(), timer.stats()["cancelled"]) == (0, 1)


def test_advance_counts_a_periodic_run_that_raises_once(make_manual) -> None:
    # the run that raises ends the periodic timeout: one task ran, not two
    timer = make_manual(0.01, 16)
    runs = []

    def fail_on_third(timeout: Timeout) -> None:
        runs.append(timer.time())
        if len(runs) == 3:
            raise ValueError("third run")

    periodic = timer.new_periodic(fail_on_third, 0.05)
    logging.getLogger("hwtimer").disabled = True
    try:
        assert timer.advance(0.12) == 2
        assert timer.advance(1) == 1
    finally:
        logging.getLogger("hwtimer").disabled = False
    assert runs == pytest.approx([0.05, 0.1, 0.15]) and periodic.is_expired()
    assert [type(e) for e in timer.task_errors] == [ValueError]
    timer.task_errors.clear()


def test_periodic_with_a_first_delay_and_stop(make_manual) -> None:
    timer = make_manual(0.1, 8)
    task = Recorder(timer)
    periodic = timer.new_periodic(task, 1, delay=0.25)
    timer.advance(2.5)
    assert task.times == pytest.approx([0.3, 1.3, 2.3])
    assert periodic.deadline == pytest.approx(3.25)
    assert timer.stop() == [periodic]
    assert periodic.is_cancelled()


def test_ticks_count_from_the_timers_start(make_manual) -> None:
    for start in (ManualTimer.start, lambda timer: None):
        timer = make_manual()
        timer.advance(0.0005)  # not started: this moves only the clock
        start(timer)
        task = Recorder(timer)
        timer.new_timeout(task, 0.001)
        timer.advance(0.01)
        assert task.times == [0.0015]


def test_a_reset_keeps_its_place_in_the_tick_only_before_the_wheel_took_it(
    manual: ManualTimer,
) -> None:
    order: list[str] = []
    takes_in = (None, lambda: manual.advance(0.001), manual.stats, manual.pending_snapshot)
    for take_in in takes_in:
        a = manual.new_timeout(lambda to: order.append("a"), 0.005)
        manual.new_timeout(lambda to: order.append("b"), 0.005)
        moved = 0.0
        if take_in is not None:
            before = manual.time()
            take_in()  # both in the wheel now
            moved = manual.time() - before
        assert a.reset(0.005 - moved) is True
        manual.advance(0.01)
    assert order == ["a", "b"] + ["b", "a"] * 3


def test_a_reset_goes_ahead_of_what_was_scheduled_before_it_and_not_taken_in(
    manual: ManualTimer,
) -> None:
    # A tick relinks the reset timeouts before it takes in those scheduled
    # since the last one: c, scheduled before a's reset but after the
    # wheel's last tick, runs after a in their common tick; b, in the
    # wheel when a was reset, runs before it.
    order: list[str] = []
    a = manual.new_timeout(lambda to: order.append("a"), 5)
    manual.new_timeout(lambda to: order.append("b"), 0.005)
    manual.advance(0.001)  # a and b in the wheel
    manual.new_timeout(lambda to: order.append("c"), 0.004)
    assert a.reset(0.004) is True
    manual.advance(0.01)
    assert order == ["b", "a", "c"]


def test_reset_timeouts_are_relinked_in_the_order_of_their_first_reset(
    manual: ManualTimer,
) -> None:
    # Between two ticks, a timeout reset again keeps the place its first
    # reset gave it among the reset ones, whatever its new deadline.
    order: list[str] = []
    handles = {n: manual.new_timeout(lambda to, n=n: order.append(n), 5) for n in "abc"}
    manual.advance(0.001)  # all three in the wheel
    for name in "bab":
        assert handles[name].reset(0.004) is True
    assert handles["c"].reset(0.003) is True
    assert handles["c"].reset(0.004) is True
    manual.advance(0.01)
    assert order == ["b", "a", "c"]


def test_reset_moves_the_deadline_on_the_manual_clock(manual: ManualTimer) -> None:
    task = Recorder(manual)
    timeout = manual.new_timeout(task, 10)
    manual.advance(8)
    assert timeout.reset(10) is True
    assert timeout.deadline == 18.0
    manual.advance(9.5)  # past the old deadline
    assert task.count == 0
    manual.advance(1)
    assert task.times == [18.0]
    assert timeout.reset(1) is False  # it has run


def test_a_timeout_cancelled_right_after_its_schedule_is_let_go_at_once(
    manual: ManualTimer,
) -> None:
    # Nothing scheduled since, and no advance: the cancel takes it straight
    # back, so its task is released without waiting for the timer's tick.
    task = Recorder(manual)
    ref = weakref.ref(task)
    assert manual.new_timeout(task, 60).cancel() is True
    del task
    assert ref() is None
    assert manual.pending_timeouts() == 0
    assert manual.stats()["cancelled"] == 1


def test_a_timeout_taken_back_by_its_cancel_can_still_be_collected_in_a_cycle(
    manual: ManualTimer,
) -> None:
    # The holder keeps its timeout and the timeout its task, the holder: a
    # cycle only the GC can free, which it can once the timer has let go.
    # The timeout joins the collector's view at the next take-back (the
    # first holder's) or when a collection starts (the second's).
    refs = []
    for _ in range(2):
        holder = Recorder(manual)
        holder.timeout = manual.new_timeout(holder, 60)  # type: ignore[attr-defined]
        assert holder.timeout.cancel() is True  # type: ignore[attr-defined]
        refs.append(weakref.ref(holder))
        del holder
    gc.collect()
    assert [ref() for ref in refs] == [None, None]


def test_a_cancelled_timeout_is_tracked_by_the_next_collection(manual: ManualTimer) -> None:
    kept = manual.new_timeout(noop, 60)
    assert kept.cancel() is True
    gc.collect()
    assert gc.is_tracked(kept)


class Task:
    def __call__(self, *args: object) -> None:
        pass


def _pending_in_every_place(timer: ManualTimer, task: Callable[[Timeout], None]) -> list[Timeout]:
    """Timeouts pending on `timer` in each place its wheel can hold one: on
    level 0, on a far level, never due, cancelled but not yet unlinked,
    reset, periodic, and queued since the last advance (not yet taken in).
    Returns those it holds a reference for (the cancelled one included)."""
    held = [
        timer.new_timeout(task, 10),
        timer.new_timeout(task, 1e9),
        timer.new_timeout(task, float("inf")),
        timer.new_timeout(task, 5),
        timer.new_timeout(task, 5),
        timer.new_periodic(task, 0.5),
    ]
    timer.advance(0.001)
    assert held[3].cancel() is True
    assert held[4].reset(7) is True
    held.append(timer.new_timeout(task, 3))
    return held


def test_a_dropped_manual_timer_is_collected_with_its_pending_timeouts() -> None:
    # Nothing can advance a manual timer nobody holds: its pending timeouts
    # hold it and it holds them, a cycle the collector frees, with the
    # warning of any timer dropped unstopped.
    task = Task()
    task_ref = weakref.ref(task)
    timer = ManualTimer()
    timer_ref = weakref.ref(timer)
    _pending_in_every_place(timer, task)
    del task, timer
    with pytest.warns(ResourceWarning, match="unstopped timer"):
        gc.collect()
    assert timer_ref() is None
    assert task_ref() is None


def test_a_dropped_manual_timer_is_collected_with_its_loop_callbacks() -> None:
    import asyncio

    loop = asyncio.new_event_loop()
    try:
        callback = Task()
        callback_ref = weakref.ref(callback)
        timer = ManualTimer()
        timer_ref = weakref.ref(timer)
        timer.call_later(5, callback, loop=loop)
        timer.call_every(1, callback, loop=loop)
        del callback, timer
        with pytest.warns(ResourceWarning, match="unstopped timer"):
            gc.collect()
        assert timer_ref() is None
        assert callback_ref() is None
    finally:
        loop.close()


def test_a_manual_timer_shows_the_collector_each_timeout_it_holds_once(
    manual: ManualTimer,
) -> None:
    # An object shown twice would let the collector free one still in use;
    # one not shown keeps a dropped timer alive.
    held = _pending_in_every_place(manual, noop)
    shown = [r for r in gc.get_referents(manual) if isinstance(r, Timeout)]
    assert sorted(map(id, shown)) == sorted(map(id, held))
    assert all(gc.is_tracked(t) for t in held)
    manual.advance(4)  # runs the queued one, unlinks the cancelled one
    shown = [r for r in gc.get_referents(manual) if isinstance(r, Timeout)]
    assert sorted(map(id, shown)) == sorted(map(id, [held[i] for i in (0, 1, 2, 4, 5)]))
    manual.stop()
    assert not [r for r in gc.get_referents(manual) if isinstance(r, Timeout)]


def test_collections_leave_what_a_held_manual_timer_runs_alone(manual: ManualTimer) -> None:
    # Tasks only the wheel holds, and collections all along (from the
    # tasks themselves too, as the advance runs them): each runs once.
    ran: list[int] = []

    def make(i: int) -> Callable[[Timeout], None]:
        def task(timeout: Timeout) -> None:
            ran.append(i)
            if i % 50 == 0:
                gc.collect()
                manual.new_timeout(make(-i - 1), 0.5)

        return task

    for i in range(1000):
        manual.new_timeout(make(i), (i % 97) / 10)
        if i % 100 == 0:
            gc.collect()
    gc.collect()
    manual.advance(20)
    assert sorted(ran) == sorted(list(range(1000)) + [-i - 1 for i in range(0, 1000, 50)])


def test_a_manual_timer_reached_only_through_the_timeouts_held_on_it_is_kept() -> None:
    # Nothing but the Timeouts a caller keeps (each also held by the
    # wheel) leads to the timer: a collection must count the wheel's
    # reference to each once, or it takes the lot for garbage and stops
    # the timer, and nothing pending runs.
    ran: list[Timeout] = []
    once = ManualTimer().new_timeout(ran.append, 1)
    periodic = once.timer.new_periodic(ran.append, 0.5)
    gc.collect()
    assert once.timer.advance(1) == 3
    assert ran == [periodic, once, periodic]
    periodic.cancel()
    assert once.timer.stop() == []


def test_reset_and_cancel_before_the_timer_takes_the_timeout(manual: ManualTimer) -> None:
    # No advance since they were scheduled: the timer has not moved them
    # into its wheel yet, and a reset or cancel acts on them there.
    task = Recorder(manual)
    sooner = manual.new_timeout(task, 10)
    later = manual.new_timeout(task, 1)
    gone = manual.new_timeout(task, 1)
    assert sooner.reset(2) is True
    assert later.reset(5) is True
    assert gone.reset(3) is True
    assert gone.cancel() is True
    assert gone.reset(4) is False
    assert manual.pending_timeouts() == 2
    manual.advance(10)
    assert task.times == [2.0, 5.0]
    assert task.calls == [sooner, later]
    assert manual.stats()["cancelled"] == 1


def test_a_task_resetting_another_within_one_advance(manual: ManualTimer) -> None:
    watched = Recorder(manual)
    timeout = manual.new_timeout(watched, 1)
    # a heartbeat every 0.5 s keeps pushing the deadline back
    manual.new_periodic(lambda t: timeout.reset(1), 0.5)
    manual.advance(60)
    assert watched.count == 0
    # the last heartbeat ran at 60.0, the end of the advance
    assert timeout.deadline == pytest.approx(61.0)
