"""The API.md rules of HashedWheelTimer, Timeout and RejectedExecutionError,
one by one."""

from __future__ import annotations

import asyncio
import concurrent.futures
import copy
import datetime
import fractions
import gc
import logging
import os
import pickle
import re
import sys
import threading
import time
import warnings
import weakref
from collections.abc import Callable

import pytest
from conftest import (
    DEADLINE,
    Counter,
    HasFloat,
    HasIndex,
    collect_until,
    native_name,
    native_thread_names,
    run_python,
    wait_for,
)

import hwtimer
from hwtimer import HashedWheelTimer, RejectedExecutionError, Timeout, _hwtimer


def noop(timeout: Timeout) -> None:
    pass


# ---- the exported names ----


def test_exports() -> None:
    assert hwtimer.HashedWheelTimer is HashedWheelTimer
    assert hwtimer.Timeout is Timeout
    assert issubclass(RejectedExecutionError, RuntimeError)


def test_timeout_is_not_created_by_users() -> None:
    with pytest.raises(TypeError):
        Timeout()


# ---- constructor and read-only attributes ----


def test_defaults() -> None:
    timer = HashedWheelTimer()
    try:
        assert timer.tick_duration == 0.1
        assert type(timer.tick_duration) is float
        assert timer.ticks_per_wheel == 512
        assert type(timer.ticks_per_wheel) is int
        assert timer.max_pending_timeouts == 0
        assert type(timer.max_pending_timeouts) is int
    finally:
        timer.stop()


def test_positional_and_keyword_arguments() -> None:
    t1 = HashedWheelTimer(0.05, 16)
    t2 = HashedWheelTimer(
        tick_duration=0.05,
        ticks_per_wheel=16,
        max_pending_timeouts=7,
        thread_name="kw-timer",
        executor=None,
    )
    try:
        assert (t1.tick_duration, t1.ticks_per_wheel) == (0.05, 16)
        assert (t2.tick_duration, t2.ticks_per_wheel) == (0.05, 16)
        assert t2.max_pending_timeouts == 7
        assert t2.thread_name == "kw-timer"
    finally:
        t1.stop()
        t2.stop()


def test_max_pending_thread_name_executor_are_keyword_only() -> None:
    for third in (0, 10):
        with pytest.raises(TypeError):
            HashedWheelTimer(0.1, 512, third)
    with pytest.raises(TypeError):
        HashedWheelTimer(0.1, 512, 10, "name")


@pytest.mark.parametrize(
    "value, expected",
    [
        (1, 1.0),
        (0.25, 0.25),
        (0.001, 0.001),
        (datetime.timedelta(milliseconds=20), 0.02),
        (datetime.timedelta(seconds=2), 2.0),
    ],
)
def test_tick_duration_accepted(value, expected) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no clamping warning for these
        timer = HashedWheelTimer(value)
    try:
        assert timer.tick_duration == pytest.approx(expected, rel=1e-9)
        assert type(timer.tick_duration) is float
    finally:
        timer.stop()


@pytest.mark.parametrize(
    "value", [0.0009, 0.0001, 1e-9, 5e-324, datetime.timedelta(microseconds=10)]
)
def test_tick_duration_below_1ms_is_clamped_with_runtime_warning(value) -> None:
    with pytest.warns(RuntimeWarning):
        timer = HashedWheelTimer(value)
    try:
        assert timer.tick_duration == 0.001
    finally:
        timer.stop()


def test_clamping_warning_points_at_the_caller() -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        timer = HashedWheelTimer(0.0001)
    timer.stop()
    [w] = [w for w in caught if issubclass(w.category, RuntimeWarning)]
    assert w.filename == __file__
    assert "0.001" in str(w.message)


@pytest.mark.parametrize(
    "args, kwargs, exc",
    [
        ((0.0001, 0), {}, ValueError),
        ((0.0001, 1.5), {}, TypeError),
        ((0.0001,), {"max_pending_timeouts": "1"}, TypeError),
        ((0.0001,), {"thread_name": b"x"}, TypeError),
        ((0.0001,), {"executor": object()}, TypeError),
    ],
)
def test_a_refused_timer_with_a_short_tick_does_not_warn(args, kwargs, exc) -> None:
    # the tick would be clamped, but there is no timer: the error is the
    # other argument's, with no warning about a clamp (raised in its place
    # under warnings-as-errors)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(exc):
            HashedWheelTimer(*args, **kwargs)


def test_clamped_timer_works(make_timer) -> None:
    with pytest.warns(RuntimeWarning):
        timer = make_timer(0.0001)
    task = Counter()
    timer.new_timeout(task, 0.01)
    assert task.wait()


@pytest.mark.parametrize(
    "value, expected",
    [
        (1, 1),
        (2, 2),
        (3, 4),
        (5, 8),
        (8, 8),
        (9, 16),
        (100, 128),
        (512, 512),
        (513, 1024),
        (1000, 1024),
        (4096, 4096),
        (2**20 - 1, 2**20),
    ],
)
def test_ticks_per_wheel_rounded_up_to_power_of_two(value, expected) -> None:
    timer = HashedWheelTimer(0.1, value)
    try:
        assert timer.ticks_per_wheel == expected
    finally:
        timer.stop()


def test_ticks_per_wheel_limit() -> None:
    with pytest.raises(ValueError):
        HashedWheelTimer(0.001, 2**30 + 1)
    with pytest.raises(ValueError):
        HashedWheelTimer(0.001, 2**31)


def test_tick_times_wheel_overflowing_64_bit_ns_is_value_error() -> None:
    # one revolution must fit in 64-bit nanoseconds (about 292 years)
    timer = HashedWheelTimer(1e9, 1)  # 1e18 ns: fits
    timer.stop()
    with pytest.raises(ValueError):
        HashedWheelTimer(1e9, 16)  # 1.6e19 ns: does not
    with pytest.raises(ValueError):
        HashedWheelTimer(3e7, 512)


@pytest.mark.parametrize("tick", [10**400, fractions.Fraction(10**400)], ids=["int", "Fraction"])
def test_a_finite_tick_past_any_float_is_too_long_not_infinite(tick: object) -> None:
    """A tick too large for a float is finite all the same: whatever kind
    of number it is, the error says it does not fit, not that it is not
    finite (which is what inf is told)."""
    with pytest.raises(ValueError, match="does not fit in 64-bit nanoseconds"):
        HashedWheelTimer(tick)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="must be > 0 and finite"):
        HashedWheelTimer(float("inf"))


def test_max_pending_timeouts_non_positive_means_no_limit(make_timer) -> None:
    for limit in (0, -1, -1000):
        timer = make_timer(max_pending_timeouts=limit)
        assert timer.max_pending_timeouts <= 0
        timeouts = [timer.new_timeout(noop, 60) for _ in range(2000)]
        assert timer.pending_timeouts() == 2000
        for t in timeouts:
            t.cancel()


def test_max_pending_timeouts_attribute(make_timer) -> None:
    assert make_timer(max_pending_timeouts=5).max_pending_timeouts == 5


def test_thread_name_attribute_and_default(make_timer) -> None:
    named = make_timer(thread_name="my-worker")
    assert named.thread_name == "my-worker"
    default = make_timer()
    assert default.thread_name.startswith("hwtimer-")
    assert default.thread_name[len("hwtimer-") :].isdigit()
    other = make_timer()
    assert other.thread_name != default.thread_name


@pytest.mark.parametrize(
    "name",
    [
        "tw",
        "hwt-test-worker",
        "a-very-long-thread-name-for-ps",
        "\u00e9\u00e9\u00e9\u00e9\u00e9\u00e9\u00e9\u00e9\u00e9\u00e9",
    ],
)
def test_worker_thread_native_name(make_timer, name) -> None:
    timer = make_timer(thread_name=name)
    assert native_name(name) not in native_thread_names()
    timer.start()
    # the worker is a native thread: it shows in /proc (and ps -T) by name
    assert wait_for(lambda: native_name(name) in native_thread_names())
    timer.stop()
    assert wait_for(lambda: native_name(name) not in native_thread_names())


@pytest.mark.parametrize(
    "name, dispatch",
    [
        ("tw", "tw-dispatch"),
        ("hwt-test-worker", "hwt-test-work-d"),
        ("request-timeout", "request-timeo-d"),
        ("\u00e9" * 7, "\u00e9" * 7 + "-"),
        ("\u00e9" * 8, "\u00e9" * 6 + "-d"),
        ("my-timer-1", "my-timer-1-disp"),
    ],
)
def test_dispatch_thread_native_name_is_not_the_workers(make_timer, name, dispatch) -> None:
    """ps -T and top -H tell a timer's dispatch thread from its worker,
    also where the timer's name fills the 15 bytes Linux keeps of a name,
    as the shared timer's does."""
    timer = make_timer(thread_name=name)
    ran = threading.Event()
    timer.new_timeout(lambda t: ran.set(), 0)
    assert ran.wait(DEADLINE)
    names = native_thread_names()
    assert native_name(name) in names
    assert dispatch in names
    assert native_name(name) != dispatch


def test_default_native_thread_name(make_timer) -> None:
    timer = make_timer()
    timer.start()
    assert wait_for(lambda: native_name(timer.thread_name) in native_thread_names())


def _slack_of(tid: int | str) -> int:
    """The timer slack, in ns, of this process's native thread `tid`."""
    with open(f"/proc/{tid}/timerslack_ns") as f:
        return int(f.read())


def _timer_slack_ns(comm: str) -> list[int]:
    """The timer slack of this process's native threads named `comm`."""
    slack = []
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                if f.read().rstrip("\n") != comm:
                    continue
            slack.append(_slack_of(tid))
        except OSError:  # the thread exited meanwhile
            pass
    return slack


@pytest.mark.skipif(
    not os.path.exists(f"/proc/{os.getpid()}/timerslack_ns"), reason="Linux 4.6 or later"
)
def test_worker_wakes_for_its_ticks_without_timer_slack(make_timer) -> None:
    # Linux lets a thread's timed wait end up to its timer slack late, 50 us
    # by default: 5 % of a 1 ms tick on every tick.  The worker asks for none.
    caller = threading.get_native_id()
    before = _slack_of(caller)
    timer = make_timer(0.001, 64, thread_name="slack-test")
    timer.start()
    assert wait_for(lambda: _timer_slack_ns("slack-test") != [])
    assert _timer_slack_ns("slack-test") == [1]
    assert _slack_of(caller) == before  # the calling thread keeps its own


def test_dispatch_thread_is_a_daemon_python_thread(make_timer) -> None:
    timer = make_timer(thread_name="disp-test")
    task = Counter()
    timer.new_timeout(task, 0)
    assert task.wait()
    assert task.threads == ["disp-test-dispatch"]
    threads = [t for t in threading.enumerate() if t.name == "disp-test-dispatch"]
    assert len(threads) == 1
    assert threads[0].daemon


@pytest.mark.skipif(sys.version_info < (3, 10), reason="Py_TPFLAGS_IMMUTABLETYPE is 3.10's")
def test_types_are_immutable(make_timer) -> None:
    # as CPython's own heap types: no one patches what every thread shares
    timer = make_timer()
    periodic = timer.new_periodic(noop, 3600)
    types = [HashedWheelTimer, Timeout, hwtimer.TimeoutScope, _hwtimer._ManualTimer, type(periodic)]
    try:
        for tp in types:
            with pytest.raises(TypeError, match="immutable"):
                tp.patched = None
            assert not hasattr(tp, "patched")
    finally:
        periodic.cancel()


@pytest.mark.parametrize(
    "attr, value",
    [
        ("tick_duration", 1.0),
        ("ticks_per_wheel", 8),
        ("max_pending_timeouts", 3),
        ("thread_name", "x"),
    ],
)
def test_attributes_are_read_only(make_timer, attr, value) -> None:
    timer = make_timer()
    before = getattr(timer, attr)
    with pytest.raises(AttributeError):
        setattr(timer, attr, value)
    with pytest.raises((AttributeError, TypeError)):
        delattr(timer, attr)
    assert getattr(timer, attr) == before


def test_a_subclass_passes_its_arguments_on_to_the_base_init() -> None:
    """The usual way to extend a class: a subclass's __init__ hands its
    arguments on with super().__init__(), which takes what the constructor
    takes (and refuses what it refuses), as __new__ already applied them."""

    class Extended(HashedWheelTimer):
        def __init__(self, *args: object, **kwargs: object) -> None:
            super().__init__(*args, **kwargs)
            self.extra = "kept"

    timer = Extended(0.05, 16, max_pending_timeouts=3, thread_name="extended")
    try:
        assert (timer.tick_duration, timer.ticks_per_wheel) == (0.05, 16)
        assert timer.max_pending_timeouts == 3
        assert timer.thread_name == "extended"
        assert timer.extra == "kept"
        fired = threading.Event()
        timer.new_timeout(lambda t: fired.set(), 0)
        assert fired.wait(DEADLINE)
    finally:
        timer.stop()
    with pytest.raises(TypeError, match="unexpected keyword argument 'tick'"):
        HashedWheelTimer.__init__(timer, tick=0.1)
    with pytest.raises(TypeError, match="positional"):
        HashedWheelTimer.__init__(timer, 0.1, 512, 0)


def test_a_subclass_init_of_its_own_signature_takes_its_own_arguments() -> None:
    """As with a class built on object: a subclass's __init__ takes what
    it declares, not the constructor's parameters, and the settings it
    hands on with super().__init__(...) are the timer's."""
    from hwtimer.testing import ManualTimer

    class Service(HashedWheelTimer):
        def __init__(self, name: str, *, tick: float = 0.05) -> None:
            super().__init__(tick, 64, thread_name=name)
            self.service = name

    class Probe(ManualTimer):
        def __init__(self, label: str) -> None:
            super().__init__(0.01, 8)
            self.label = label

    service = Service("svc", tick=0.02)
    try:
        assert (service.tick_duration, service.ticks_per_wheel) == (0.02, 64)
        assert (service.thread_name, service.service) == ("svc", "svc")
        fired = threading.Event()
        service.new_timeout(lambda t: fired.set(), 0)
        assert fired.wait(DEADLINE)
    finally:
        service.stop()
    probe = Probe("p")
    assert (probe.tick_duration, probe.ticks_per_wheel, probe.label) == (0.01, 8, "p")
    ran: list[float] = []
    probe.new_timeout(lambda t: ran.append(probe.time()), 0.025)
    probe.advance(0.03)
    assert ran == [pytest.approx(0.03)]
    assert probe.stop() == []

    class Unset(HashedWheelTimer):
        def __init__(self, tick: float) -> None:
            self.tick = tick  # the base's __init__ is not called

    assert Unset(0.5).tick_duration == 0.1  # the default

    class Quiet(ManualTimer):
        def __init__(self, name: str) -> None:
            self.name = name  # the base's __init__ is not called

    def fails(_timeout: object) -> None:
        raise LookupError("the task failed")

    quiet = Quiet("q")
    assert quiet.task_errors == []  # the list a ManualTimer lists its tasks' errors in
    quiet.new_timeout(fails, 0.01)
    with pytest.raises(AttributeError, match="'Quiet' object has no attribute 'nmae'"):
        quiet.nmae  # noqa: B018
    assert quiet.advance(0.01) == 1
    assert [type(e) for e in quiet.task_errors] == [LookupError]
    quiet.stop()
    # what its __init__ hands on is checked, and a clamped tick warned of, once
    with pytest.raises(ValueError, match="tick_duration"):
        Service("bad", tick=-1)
    with pytest.warns(RuntimeWarning, match="clamped") as warned:
        assert Service("fine", tick=1e-6).tick_duration == 0.001
    assert len(warned) == 1


def test_a_subclass_init_applies_or_refuses_the_arguments_it_hands_on() -> None:
    """A subclass's __init__ that sets the timer up itself, with
    super().__init__(...) and other values than the constructor was given,
    gets a timer with those settings, and its bad values are refused as the
    constructor refuses them; a started timer refuses new ones."""
    executor = concurrent.futures.ThreadPoolExecutor(1)

    class Fast(HashedWheelTimer):
        def __init__(self) -> None:
            super().__init__(
                0.01, 64, max_pending_timeouts=5, thread_name="fast", executor=executor
            )

    class Named(HashedWheelTimer):
        def __init__(self, *args: object) -> None:
            super().__init__(*args, thread_name="named")

    fast = Fast()
    named = Named(0.05)
    try:
        assert (fast.tick_duration, fast.ticks_per_wheel) == (0.01, 64)
        assert (fast.max_pending_timeouts, fast.thread_name) == (5, "fast")
        assert (named.tick_duration, named.thread_name) == (0.05, "named")
        ran = []
        fired = threading.Event()
        fast.new_timeout(lambda t: (ran.append(threading.current_thread()), fired.set()), 0)
        assert fired.wait(DEADLINE)
        assert ran[0].name.startswith("ThreadPoolExecutor")
    finally:
        fast.stop()
        named.stop()
        executor.shutdown()

    class Bad(HashedWheelTimer):
        def __init__(self, **kwargs: object) -> None:
            super().__init__(**kwargs)

    with pytest.raises(ValueError, match="tick_duration"):
        Bad(tick_duration=0.1).__init__(tick_duration=-1)
    with pytest.raises(TypeError, match="ticks_per_wheel"):
        Bad(ticks_per_wheel=8).__init__(ticks_per_wheel="x")
    started = Bad(tick_duration=0.05)
    try:
        started.start()
        with pytest.raises(RuntimeError, match="started"):
            started.__init__(tick_duration=0.5)
        started.__init__(tick_duration=0.05)  # what it has: nothing to change
        assert started.tick_duration == 0.05
    finally:
        started.stop()


def test_init_refuses_a_change_to_a_timer_started_while_it_warned() -> None:
    """A clamped tick handed to __init__ warns, and a warning hook may run
    any code, even start() of the timer being set up: the started timer
    then keeps its settings, and __init__ says why it does not take the
    new ones."""
    timer = HashedWheelTimer(0.05)

    def start_it(*args: object, **kwargs: object) -> None:
        timer.start()

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("always")
            warnings.showwarning = start_it
            with pytest.raises(RuntimeError, match="started"):
                timer.__init__(tick_duration=0.0001)
        assert timer.tick_duration == 0.05
        fired = threading.Event()
        timer.new_timeout(lambda t: fired.set(), 0)
        assert fired.wait(DEADLINE)
    finally:
        timer.stop()


def test_a_manual_timer_subclass_init_applies_what_it_hands_on() -> None:
    """The same for a ManualTimer: a subclass that sets its tick with
    super().__init__(...) gets it, bad values are refused, and a tick that
    is clamped warns once, not once for __new__ and again for __init__."""
    from hwtimer.testing import ManualTimer

    class Coarse(ManualTimer):
        def __init__(self) -> None:
            super().__init__(tick_duration=0.1, ticks_per_wheel=16)

    class Bad(ManualTimer):
        def __init__(self) -> None:
            super().__init__(tick_duration="x")

    with Coarse() as coarse:
        assert (coarse.tick_duration, coarse.ticks_per_wheel) == (0.1, 16)
        ran = []
        coarse.new_timeout(ran.append, 0.15)
        assert coarse.advance(0.2) == 1
        assert ran
    with pytest.raises(TypeError, match="tick_duration"):
        Bad()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with ManualTimer(0.0001) as clamped:
            assert clamped.tick_duration == 0.001
    assert [str(w.message) for w in caught if w.category is RuntimeWarning] == [
        "tick_duration below 0.001 s is clamped to 0.001 s"
    ]


def test_a_subclass_with_its_own_new_takes_its_own_arguments() -> None:
    """A subclass whose __new__ takes other arguments than the constructor,
    and that defines no __init__, is called with its own: the base's
    __init__ leaves them to that __new__, as object.__init__ does."""

    class Named(HashedWheelTimer):
        def __new__(cls, name: str, **options: object) -> Named:
            timer = super().__new__(cls, 0.05, 16, thread_name=name)
            timer.options = options
            return timer

    for timer in (Named("svc", color=1), Named(name="svc")):
        try:
            assert timer.thread_name == "svc"
            assert timer.ticks_per_wheel == 16
        finally:
            timer.stop()
    assert Named("svc", color=1).options == {"color": 1}


def test_a_subclass_with_its_own_new_and_init_keeps_the_settings_it_hands_on() -> None:
    """A subclass that defines both __new__ and __init__ gets the settings
    it hands on, to super().__new__(...) or to super().__init__(...): a
    ManualTimer subclass with a __new__ of its own (ManualTimer has its own
    __init__) too, and a clamped tick warns once."""
    from hwtimer.testing import ManualTimer

    class Both(HashedWheelTimer):
        def __new__(cls, *args: object, **kwargs: object) -> Both:
            return super().__new__(cls, *args, **kwargs)

        def __init__(self, *args: object, **kwargs: object) -> None:
            super().__init__(*args, **kwargs)

    class ByNew(HashedWheelTimer):
        def __new__(cls, name: str) -> ByNew:
            return super().__new__(cls, 0.05, 16, thread_name=name)

        def __init__(self, name: str) -> None:
            super().__init__()
            self.label = name

    class Manual(ManualTimer):
        def __new__(cls, *args: object, **kwargs: object) -> Manual:
            return super().__new__(cls, *args, **kwargs)

    for timer in (Both(0.05, 16, thread_name="svc"), ByNew("svc")):
        try:
            assert (timer.tick_duration, timer.ticks_per_wheel) == (0.05, 16)
            assert timer.thread_name == "svc"
        finally:
            timer.stop()
    with Manual(0.5, 8) as manual:
        assert (manual.tick_duration, manual.ticks_per_wheel) == (0.5, 8)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with Manual(0.0001) as clamped:
            assert clamped.tick_duration == 0.001
    assert len([w for w in caught if w.category is RuntimeWarning]) == 1


def test_a_manual_timer_subclass_new_sets_what_its_init_does_not_hand_on() -> None:
    """A ManualTimer subclass whose __new__ gives the timer its settings,
    and whose __init__ calls super().__init__() with none, keeps them: the
    defaults of ManualTimer.__init__ are not handed on as if given."""
    from hwtimer.testing import ManualTimer

    class Labelled(ManualTimer):
        def __new__(cls, label: str) -> Labelled:
            return super().__new__(cls, 0.5, 8, max_pending_timeouts=3)

        def __init__(self, label: str) -> None:
            super().__init__()
            self.label = label

    with Labelled("a") as timer:
        assert (timer.tick_duration, timer.ticks_per_wheel) == (0.5, 8)
        assert (timer.label, timer.task_errors) == ("a", [])
        for _ in range(3):
            timer.new_timeout(lambda t: None, 10)
        with pytest.raises(RejectedExecutionError):
            timer.new_timeout(lambda t: None, 10)
    with ManualTimer() as plain, ManualTimer(0.01, 8, max_pending_timeouts=1) as given:
        assert (plain.tick_duration, plain.ticks_per_wheel) == (0.001, 4096)
        assert (given.tick_duration, given.ticks_per_wheel) == (0.01, 8)
        given.new_timeout(lambda t: None, 1)
        with pytest.raises(RejectedExecutionError):
            given.new_timeout(lambda t: None, 1)


def test_scheduling_calls_a_subclass_start() -> None:
    """new_timeout() calls start() for you (API.md): a subclass's override
    of start() (to log, to set up) is that start(), for new_periodic() and
    call_later() too; an override that does not start the timer leaves it
    to the built-in one, and one that raises refuses the schedule."""
    calls = []

    class Logged(HashedWheelTimer):
        def start(self) -> None:
            calls.append("start")
            super().start()

    class Lazy(HashedWheelTimer):
        def start(self) -> None:
            calls.append("lazy")

    class Refusing(HashedWheelTimer):
        def start(self) -> None:
            raise OSError("not now")

    with Logged(0.01) as first:
        fired = threading.Event()
        first.new_timeout(lambda t: fired.set(), 0)
        assert fired.wait(DEADLINE)
        first.new_timeout(lambda t: None, 0)
    assert calls == ["start"]
    with Logged(0.01) as second:
        second.new_periodic(lambda t: None, 10).cancel()

    async def call_later(timer: HashedWheelTimer) -> None:
        timer.call_later(10, print).cancel()

    with Logged(0.01) as third:
        asyncio.run(call_later(third))
    assert calls == ["start"] * 3
    with Lazy(0.01) as lazy:
        fired = threading.Event()
        lazy.new_timeout(lambda t: fired.set(), 0)
        assert fired.wait(DEADLINE)
    assert calls == ["start"] * 3 + ["lazy"]
    with Refusing(0.01) as refusing:
        with pytest.raises(OSError, match="not now"):
            refusing.new_timeout(lambda t: None, 0)
        assert refusing.pending_timeouts() == 0


def test_a_subclass_start_that_schedules_first_is_not_called_again() -> None:
    """A start() override that schedules before it calls super().start()
    (a heartbeat set up with the timer) runs once: its own schedule starts
    the timer with the built-in start instead of calling it again."""
    calls = []
    fired = threading.Event()

    class Heartbeat(HashedWheelTimer):
        def start(self) -> None:
            calls.append("start")
            self.new_timeout(lambda t: fired.set(), 0)
            super().start()

    with Heartbeat(0.01) as timer:
        timer.new_timeout(lambda t: None, 10)
        assert fired.wait(DEADLINE)
        assert timer.pending_timeouts() == 1
    assert calls == ["start"]


def test_a_subclass_start_is_called_for_each_thread_that_schedules() -> None:
    """While one thread is in a start() override, another thread's
    schedule calls the override too, rather than start the timer with the
    built-in start: an override that refuses refuses both schedules."""
    inside = threading.Event()
    go_on = threading.Event()
    calls = []

    class Refusing(HashedWheelTimer):
        def start(self) -> None:
            calls.append(threading.current_thread().name)
            inside.set()
            go_on.wait(DEADLINE)
            raise OSError("not now")

    refused = []

    def schedule() -> None:
        try:
            timer.new_timeout(lambda t: None, 10)
        except OSError:
            refused.append(threading.current_thread().name)

    with Refusing(0.01) as timer:
        first = threading.Thread(target=schedule, name="first")
        first.start()
        assert inside.wait(DEADLINE)
        second = threading.Thread(target=schedule, name="second")
        second.start()
        assert wait_for(lambda: len(calls) == 2 or not second.is_alive())
        go_on.set()
        first.join(DEADLINE)
        second.join(DEADLINE)
        assert sorted(calls) == ["first", "second"]
        assert sorted(refused) == ["first", "second"]
        assert timer.pending_timeouts() == 0


def test_with_block_calls_a_subclass_stop() -> None:
    """A subclass that overrides stop() (to log, to flush) has it called at
    the end of a with block, as a context manager written in Python would;
    a subclass that does not is stopped by the built-in one."""
    calls = []

    class Logged(HashedWheelTimer):
        def stop(self) -> list[Timeout]:
            left = super().stop()
            calls.append(len(left))
            return left

    with Logged(0.01) as timer:
        timer.new_timeout(lambda t: None, 60)
    assert calls == [1]
    assert " stopped," in repr(timer)

    class Plain(HashedWheelTimer):
        pass

    with Plain(0.01) as plain:
        plain.start()
    assert " stopped," in repr(plain)

    class Refusing(HashedWheelTimer):
        def stop(self) -> list[Timeout]:
            raise ValueError("refused")

    refusing = Refusing(0.01)
    with pytest.raises(ValueError, match="refused"), refusing:
        refusing.start()
    HashedWheelTimer.stop(refusing)


# ---- start() ----


def test_start_is_idempotent(make_timer) -> None:
    timer = make_timer(thread_name="start-twice")
    assert timer.start() is None
    assert timer.start() is None
    timer.start()
    assert wait_for(lambda: native_thread_names().count("start-twice") == 1)
    time.sleep(0.05)
    assert native_thread_names().count("start-twice") == 1


def test_new_timeout_starts_the_timer(make_timer) -> None:
    timer = make_timer(thread_name="autostart")
    assert "autostart" not in native_thread_names()
    task = Counter()
    timer.new_timeout(task, 0)
    assert task.wait()
    assert "autostart" in native_thread_names()


def test_start_after_stop_is_runtime_error(make_timer) -> None:
    timer = make_timer()
    timer.start()
    timer.stop()
    with pytest.raises(RuntimeError):
        timer.start()


def test_start_after_stop_of_never_started_timer_is_runtime_error(make_timer) -> None:
    timer = make_timer()
    assert timer.stop() == []
    with pytest.raises(RuntimeError):
        timer.start()
    with pytest.raises(RuntimeError):
        timer.new_timeout(noop, 0)


def test_a_stopped_timer_that_is_asked_to_start_names_itself(make_timer) -> None:
    # the error of a schedule that finds the timer stopped says which
    # timer it is, and that it does not start again
    timer = make_timer(thread_name="jobs")
    timer.start()
    timer.stop()
    with pytest.raises(RuntimeError, match=r"stopped timer \('jobs'\).*not start again"):
        timer.new_timeout(noop, 0)


def test_a_timer_named_as_the_shared_one_is_not_taken_for_it() -> None:
    # only default_timer()'s own timer gets the shared timer's error: a
    # user's timer with its thread name is told to make a new one (not
    # make_timer's, which would take the shared timer's threads for its own)
    timer = hwtimer.HashedWheelTimer(0.01, 64, thread_name="hwtimer-default")
    timer.start()
    timer.stop()
    with pytest.raises(RuntimeError, match="make a new one") as e:
        timer.new_timeout(noop, 0)
    assert "default_timer()" not in str(e.value)


def test_a_sleep_after_a_stop_of_the_shared_timer_says_that_it_is_stopped() -> None:
    # the shared timer stopped by a user's stop(): a later sleep() in any
    # loop of the process names it in its error, which is final
    code = """if True:
        import asyncio, hwtimer
        hwtimer.default_timer().stop()
        async def main():
            await hwtimer.sleep(0.01)
        for _ in range(2):
            try:
                asyncio.run(main())
            except RuntimeError as e:
                print(e)
    """
    proc = run_python(code)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert len(lines) == 2 and lines[0] == lines[1], lines
    assert "stopped timer ('hwtimer-default')" in lines[0], lines
    assert "hwtimer.default_timer()" in lines[0], lines


@pytest.mark.parametrize("protocol", range(pickle.HIGHEST_PROTOCOL + 1))
def test_no_timer_can_be_pickled_or_copied_and_the_error_says_so(protocol: int) -> None:
    # at every protocol, for a subclass too (ManualTimer, a user's): not
    # protocols 0 and 1 making the timer the tick_duration of a new one
    from hwtimer.testing import ManualTimer

    class MyTimer(HashedWheelTimer):
        pass

    for timer in (HashedWheelTimer(0.01, 64), MyTimer(0.01, 64), ManualTimer()):
        refused = f"cannot pickle '(hwtimer\\.)?{type(timer).__name__}' object"
        with pytest.raises(TypeError, match=refused):
            pickle.dumps(timer, protocol)
        for copier in (copy.copy, copy.deepcopy):
            with pytest.raises(TypeError, match=refused):
                copier(timer)
        assert timer.stop() == []


def test_default_timer_asked_again_as_it_is_made_returns_one_timer() -> None:
    # A signal handler (here, a profile hook, at a point where one can
    # run) that asks for the shared timer while the thread's first
    # default_timer() call makes it: it does not wait for ever for the lock
    # that this thread holds, and both calls return the same timer.
    code = """if True:
        import sys, threading, hwtimer
        from hwtimer import _default

        inner = []

        def hook(frame, event, arg):
            if event == "c_call" and arg is _default._mark_shared and not inner:
                inner.append(None)
                inner.append(hwtimer.default_timer())

        sys.setprofile(hook)
        try:
            outer = hwtimer.default_timer()
        finally:
            sys.setprofile(None)
        print(inner[1] is outer, outer is hwtimer.default_timer())
        ran = threading.Event()
        outer.new_timeout(lambda t: ran.set(), 0)
        print(ran.wait(30), outer.stop())
    """
    proc = run_python(code, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert (proc.stdout, proc.stderr) == ("True True\nTrue []\n", "")


def test_warning_of_too_many_timers_lets_its_handler_stop_them() -> None:
    # The error logged when a 65th timer starts: a handler that answers it
    # by stopping every timer, the one starting too, must not wait for a
    # dispatch thread that its own start() has not started yet.
    code = """
        import logging, hwtimer

        timers = []
        records = []

        class StopAll(logging.Handler):
            def emit(self, record):
                records.append(record.getMessage())
                for t in timers:
                    t.stop()

        logging.getLogger("hwtimer").addHandler(StopAll())
        for _ in range(65):
            timers.append(hwtimer.HashedWheelTimer(0.01))
            timers[-1].start()
        assert len(records) == 1 and "more than 64" in records[0], records
        for t in timers:
            assert "stopped" in repr(t), t
            try:
                t.new_timeout(lambda to: None, 0)
            except RuntimeError:
                pass
            else:
                raise AssertionError("a stopped timer took a timeout")
        print("ok", flush=True)
    """
    proc = run_python(code, timeout=30)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "ok\n"


def test_manual_timers_do_not_count_towards_too_many_timers() -> None:
    # The ERROR for more than 64 running timers is about their threads: a
    # ManualTimer has none.  A test suite's unstopped manual timers neither
    # log it nor use up the one ERROR a process logs, so 65 real timers
    # after them still do.
    code = """
        import logging, hwtimer
        from hwtimer.testing import ManualTimer

        records = []

        class Keep(logging.Handler):
            def emit(self, record):
                records.append(record.getMessage())

        logging.getLogger("hwtimer").addHandler(Keep())
        manual = [ManualTimer() for _ in range(100)]
        for t in manual:
            t.new_timeout(lambda to: None, 1)  # started
        assert records == [], records
        real = []
        for _ in range(64):
            real.append(hwtimer.HashedWheelTimer(0.01))
            real[-1].start()
        assert records == [], records
        real.append(hwtimer.HashedWheelTimer(0.01))
        real[-1].start()
        assert len(records) == 1 and "more than 64" in records[0], records
        for t in manual + real:
            t.stop()
        print("ok", flush=True)
    """
    proc = run_python(code, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "ok\n"


# ---- new_timeout() and Timeout ----


def test_task_gets_the_returned_timeout_exactly_once(timer) -> None:
    task = Counter()
    timeout = timer.new_timeout(task, 0.02)
    assert task.wait()
    time.sleep(0.1)  # a few more ticks: still once
    assert task.count == 1
    assert task.calls[0] is timeout


def test_timeout_attributes(timer) -> None:
    task = Counter()
    timeout = timer.new_timeout(task, 0.02)
    assert timeout.timer is timer
    assert timeout.task is task
    assert isinstance(timeout, Timeout)
    assert type(timeout.deadline) is float
    assert not timeout.is_expired()
    assert not timeout.is_cancelled()
    assert task.wait()
    assert wait_for(timeout.is_expired)
    assert not timeout.is_cancelled()
    # both stay readable after the timeout fired
    assert timeout.timer is timer
    assert timeout.task is task

    other = timer.new_timeout(task, 60)
    assert other.cancel()
    assert other.timer is timer
    assert other.task is task
    assert wait_for(lambda: timer.pending_timeouts() == 0)
    assert other.timer is timer
    assert other.task is task


def test_timeout_attributes_are_read_only(timer) -> None:
    timeout = timer.new_timeout(noop, 60)
    for attr, value in (("timer", None), ("task", noop), ("deadline", 0.0)):
        with pytest.raises(AttributeError):
            setattr(timeout, attr, value)


def test_deadline_is_on_the_monotonic_clock(timer) -> None:
    before = time.monotonic()
    timeout = timer.new_timeout(noop, 0.5)
    after = time.monotonic()
    assert before + 0.5 - 1e-6 <= timeout.deadline <= after + 0.5 + 1e-3

    before = time.monotonic()
    far = timer.new_timeout(noop, 3600)
    after = time.monotonic()
    assert before + 3600 - 1e-6 <= far.deadline <= after + 3600 + 1e-3


def test_task_never_runs_before_its_deadline(timer) -> None:
    seen = []

    def task(timeout: Timeout) -> None:
        seen.append((time.monotonic(), timeout.deadline))

    start = time.monotonic()
    timer.new_timeout(task, 0.1)
    assert wait_for(lambda: seen)
    now, deadline = seen[0]
    assert now >= deadline
    assert now >= start + 0.1


@pytest.mark.parametrize(
    "delay",
    [0, 0.0, -0.0, -1, -1e9, float("-inf"), datetime.timedelta(0), datetime.timedelta(seconds=-5)],
)
def test_delay_at_or_below_zero_fires_at_next_tick(timer, delay) -> None:
    task = Counter()
    timeout = timer.new_timeout(task, delay)
    assert task.wait()
    assert task.calls == [timeout]
    assert timeout.is_expired()


@pytest.mark.parametrize(
    "delay", [1e300, float("inf"), 10**100, 2**63, 2**64, 10**400, 1e10, datetime.timedelta.max]
)
def test_huge_delay_never_fires_and_does_not_overflow(timer, delay) -> None:
    task = Counter()
    timeout = timer.new_timeout(task, delay)
    assert timeout.deadline == float("inf")
    ok = timer.new_timeout(noop, 0)  # the wheel keeps turning past it
    assert wait_for(ok.is_expired)
    time.sleep(0.1)
    assert task.count == 0
    assert not timeout.is_expired()
    assert timer.pending_timeouts() == 1
    assert timeout.cancel()
    assert wait_for(lambda: timer.pending_timeouts() == 0)
    assert task.count == 0


def test_delay_types(timer) -> None:
    class MyFloat(float):
        pass

    class MyInt(int):
        pass

    task = Counter()
    delays = [
        0.01,
        0,
        MyFloat(0.01),
        MyInt(0),
        HasFloat(0.01),
        HasIndex(0),
        datetime.timedelta(milliseconds=10),
    ]
    timeouts = [timer.new_timeout(task, d) for d in delays]
    assert task.wait(len(delays))
    assert sorted(map(id, task.calls)) == sorted(map(id, timeouts))


def test_timedelta_delay_sets_deadline(timer) -> None:
    before = time.monotonic()
    timeout = timer.new_timeout(noop, datetime.timedelta(minutes=2, microseconds=5))
    after = time.monotonic()
    assert before + 120.000005 - 1e-6 <= timeout.deadline <= after + 120.000005 + 1e-3


def test_new_timeout_keyword_arguments(timer) -> None:
    task = Counter()
    timer.new_timeout(task=task, delay=0)
    timer.new_timeout(task, delay=0)
    assert task.wait(2)


def test_cancel(timer) -> None:
    task = Counter()
    timeout = timer.new_timeout(task, 0.05)
    assert timeout.cancel() is True
    assert timeout.is_cancelled()
    assert not timeout.is_expired()
    assert timeout.cancel() is False
    time.sleep(0.2)
    assert task.count == 0
    assert timeout.cancel() is False


def test_cancel_after_expiry_returns_false(timer) -> None:
    task = Counter()
    timeout = timer.new_timeout(task, 0)
    assert task.wait()
    assert timeout.cancel() is False
    assert timeout.is_expired()
    assert not timeout.is_cancelled()


def test_pending_timeouts(timer) -> None:
    assert timer.pending_timeouts() == 0
    blocker = threading.Event()
    started = threading.Event()

    def slow(timeout: Timeout) -> None:
        started.set()
        blocker.wait(DEADLINE)

    timeouts = [timer.new_timeout(noop, 60) for _ in range(5)]
    assert timer.pending_timeouts() == 5
    timer.new_timeout(slow, 0)
    assert timer.pending_timeouts() in (5, 6)
    assert started.wait(DEADLINE)
    # expired: no longer pending, even though its task is still running
    assert timer.pending_timeouts() == 5
    blocker.set()
    timeouts[0].cancel()
    timeouts[1].cancel()
    # a cancel is counted at the next tick
    assert wait_for(lambda: timer.pending_timeouts() == 3)
    for t in timeouts:
        t.cancel()
    assert wait_for(lambda: timer.pending_timeouts() == 0)


def test_rejected_execution_error(make_timer) -> None:
    timer = make_timer(max_pending_timeouts=3)
    timeouts = [timer.new_timeout(noop, 60) for _ in range(3)]
    task = Counter()
    with pytest.raises(RejectedExecutionError):
        timer.new_timeout(task, 0)
    with pytest.raises(RuntimeError):  # a RuntimeError, too
        timer.new_timeout(task, 0)
    assert timer.pending_timeouts() == 3
    time.sleep(0.1)
    assert task.count == 0  # the rejected ones were not scheduled
    timeouts[0].cancel()
    assert wait_for(lambda: timer.pending_timeouts() == 2)
    timer.new_timeout(task, 0)
    assert task.wait()
    assert task.count == 1


def test_rejected_when_full_of_due_timeouts(make_timer) -> None:
    timer = make_timer(max_pending_timeouts=1)
    timer.new_timeout(noop, 60)
    with pytest.raises(RejectedExecutionError):
        timer.new_timeout(noop, -1)


@pytest.mark.parametrize("kind", ["new_timeout", "new_periodic", "call_later", "call_every"])
def test_a_rejected_schedule_changes_nothing_but_the_rejected_count(make_timer, kind) -> None:
    """Every way of scheduling is refused by a full timer the same way: the
    message names the limit, nothing runs, and only stats()["rejected"]
    moves."""
    timer = make_timer(0.005, max_pending_timeouts=2)
    ran = []
    schedule = {
        "new_timeout": lambda: timer.new_timeout(ran.append, 0),
        "new_periodic": lambda: timer.new_periodic(ran.append, 0.005, delay=0),
        "call_later": lambda: timer.call_later(0, ran.append, kind),
        "call_every": lambda: timer.call_every(0.005, ran.append, kind, delay=0),
    }[kind]

    async def main() -> None:
        kept = [timer.new_periodic(noop, 60), timer.new_timeout(noop, 60)]
        before = timer.stats()
        with pytest.raises(RejectedExecutionError, match=r"max_pending_timeouts \(2\)"):
            schedule()
        await asyncio.sleep(0.1)
        after = timer.stats()
        assert ran == []
        assert timer.pending_timeouts() == 2
        assert after["rejected"] == before["rejected"] + 1
        for key in ("pending", "scheduled", "expired", "cancelled", "task_errors"):
            assert after[key] == before[key], key
        assert set(map(id, timer.stop())) == set(map(id, kept))

    asyncio.run(main())


# ---- stop() ----


def test_stop_returns_unprocessed_timeouts_cancelled(timer) -> None:
    fired = Counter()
    done = timer.new_timeout(fired, 0)
    assert fired.wait()
    cancelled = timer.new_timeout(fired, 60)
    cancelled.cancel()
    pending = {timer.new_timeout(fired, 60 + i) for i in range(10)}
    pending.add(timer.new_timeout(fired, float("inf")))
    result = timer.stop()
    assert isinstance(result, list)
    assert len(result) == len(pending)
    assert set(map(id, result)) == set(map(id, pending))
    assert done not in result and cancelled not in result
    for timeout in result:
        assert timeout.is_cancelled()
        assert not timeout.is_expired()
        assert timeout.cancel() is False
        assert timeout.timer is timer
        assert timeout.task is fired
    assert timer.pending_timeouts() == 0
    time.sleep(0.05)
    assert fired.count == 1


def test_second_stop_returns_empty_list(timer) -> None:
    timer.new_timeout(noop, 60)
    assert len(timer.stop()) == 1
    assert timer.stop() == []
    assert timer.stop() == []


def test_stop_of_never_started_timer(make_timer) -> None:
    timer = make_timer()
    assert timer.stop() == []
    assert timer.stop() == []


def test_new_timeout_after_stop_is_runtime_error(timer) -> None:
    timer.new_timeout(noop, 0)
    timer.stop()
    task = Counter()
    with pytest.raises(RuntimeError):
        timer.new_timeout(task, 0)
    assert timer.pending_timeouts() == 0
    time.sleep(0.05)
    assert task.count == 0


def stopping_own_timer(outcome: list) -> Callable[[Timeout], None]:
    """A task that stops its own timer and records what stop() did."""

    def task(timeout: Timeout) -> None:
        try:
            timeout.timer.stop()
        except RuntimeError as e:
            outcome.append(e)
        else:
            outcome.append(None)

    return task


def test_stop_inside_task_is_runtime_error(timer) -> None:
    outcome = []
    task = stopping_own_timer(outcome)
    timer.new_timeout(task, 0)
    assert wait_for(lambda: outcome)
    assert isinstance(outcome[0], RuntimeError)
    # and the timer was not stopped by it
    again = Counter()
    timer.new_timeout(again, 0)
    assert again.wait()


def test_stop_of_another_timer_inside_task_works(make_timer) -> None:
    first = make_timer()
    second = make_timer()
    pending = second.new_timeout(noop, 60)
    results = []
    first.new_timeout(lambda t: results.append(second.stop()), 0)
    assert wait_for(lambda: results)
    assert results[0] == [pending]


def test_stop_waits_for_running_task(timer) -> None:
    started = threading.Event()
    finished = threading.Event()

    def slow(timeout: Timeout) -> None:
        started.set()
        time.sleep(0.3)
        finished.set()

    timer.new_timeout(slow, 0)
    assert started.wait(DEADLINE)
    timer.stop()
    assert finished.is_set()


def test_expired_tasks_still_run_before_stop_returns(timer) -> None:
    release = threading.Event()
    started = threading.Event()

    def blocker(timeout: Timeout) -> None:
        started.set()
        release.wait(DEADLINE)

    task = Counter()
    timer.new_timeout(blocker, 0)
    assert started.wait(DEADLINE)
    # the dispatch thread is busy: these expire and queue up behind it
    queued = [timer.new_timeout(task, 0) for _ in range(50)]
    assert wait_for(lambda: all(t.is_expired() for t in queued))
    threading.Timer(0.2, release.set).start()
    result = timer.stop()
    assert result == []
    assert task.count == 50
    assert set(map(id, task.calls)) == set(map(id, queued))


def test_no_task_starts_after_stop_returns(timer) -> None:
    stopped = threading.Event()
    late = []
    task = Counter()

    def watched(timeout: Timeout) -> None:
        if stopped.is_set():
            late.append(timeout)
        task(timeout)

    timeouts = []
    for i in range(3000):
        timeouts.append(timer.new_timeout(watched, (i % 30) * 0.005))
    time.sleep(0.05)
    returned = timer.stop()
    stopped.set()
    count = task.count
    time.sleep(0.3)
    assert late == []
    assert task.count == count
    # exactly once holds across stop(): each ran or was handed back
    assert count + len(returned) == len(timeouts)
    assert not set(map(id, returned)) & set(map(id, task.calls))


def assert_one_stop_returns_all(timer: HashedWheelTimer, n: int, timeouts: list[Timeout]) -> None:
    """Calls stop() from n threads at once: one call returns all of
    `timeouts`, the others []."""
    barrier = threading.Barrier(n)
    results: list[list[Timeout]] = []

    def stop() -> None:
        barrier.wait()
        results.append(timer.stop())

    threads = [threading.Thread(target=stop) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(DEADLINE)
    assert len(results) == n
    returned = [to for r in results for to in r]
    assert sorted(map(id, returned)) == sorted(map(id, timeouts))
    assert sorted(map(len, results)) == [0] * (n - 1) + [len(timeouts)]


def test_stop_from_two_threads(timer) -> None:
    timeouts = [timer.new_timeout(noop, 60) for _ in range(100)]
    assert_one_stop_returns_all(timer, 4, timeouts)


def test_stop_from_threads_at_once_returns_everything_from_one_call(make_timer) -> None:
    # Periodic runs going on an executor when the calls come: the call that
    # stops the timer returns all that was pending, those runs included,
    # and the others return [], however their waits end.
    def run(timeout: Timeout) -> None:
        time.sleep(0.0005)

    for _ in range(60):
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            timer = make_timer(0.001, 64, executor=pool)
            timeouts = [timer.new_timeout(noop, 60) for _ in range(20)]
            timeouts += [timer.new_periodic(run, 0.001) for _ in range(10)]
            time.sleep(0.01)
            assert_one_stop_returns_all(timer, 3, timeouts)


# ---- executor= ----


def test_executor_runs_tasks(make_timer) -> None:
    with concurrent.futures.ThreadPoolExecutor(2, thread_name_prefix="hwt-pool") as pool:
        timer = make_timer(executor=pool)
        task = Counter()
        timeouts = [timer.new_timeout(task, 0.01) for _ in range(20)]
        assert task.wait(20)
        assert all(name.startswith("hwt-pool") for name in task.threads)
        assert sorted(map(id, task.calls)) == sorted(map(id, timeouts))
        timer.stop()


class RecordingExecutor:
    """Keeps what it was given; runs it only when asked."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.submitted: list = []

    def submit(self, fn, *args):
        with self.lock:
            self.submitted.append((fn, args))

    def run_all(self) -> None:
        for fn, args in self.submitted:
            fn(*args)


def test_executor_submit_and_stop(make_timer) -> None:
    executor = RecordingExecutor()
    timer = make_timer(executor=executor)
    task = Counter()
    timeouts = [timer.new_timeout(task, (i % 20) * 0.005) for i in range(400)]
    time.sleep(0.05)
    returned = timer.stop()
    count = len(executor.submitted)
    time.sleep(0.2)
    assert len(executor.submitted) == count  # nothing submitted after stop
    assert task.count == 0  # our executor has run nothing yet
    executor.run_all()
    # each was submitted once, or handed back by stop(): exactly once
    assert task.count + len(returned) == len(timeouts)
    fired = set(map(id, task.calls))
    assert len(fired) == task.count
    assert fired | set(map(id, returned)) == set(map(id, timeouts))
    assert not fired & set(map(id, returned))


def test_stop_waits_for_no_run_of_the_executor(make_timer) -> None:
    # The README: stop() returns once the expired tasks are submitted; a
    # task going on the executor then goes on, and one submitted behind
    # it begins after stop() has returned, once.
    release = threading.Event()
    begun = threading.Event()

    def held(timeout: Timeout) -> None:
        begun.set()
        release.wait(DEADLINE)

    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        timer = make_timer(executor=pool)
        timer.new_timeout(held, 0)
        assert begun.wait(DEADLINE)
        behind = Counter()
        queued = timer.new_timeout(behind, 0)
        assert wait_for(queued.is_expired)  # submitted, behind the held one
        returned: list = []
        stopper = threading.Thread(target=lambda: returned.append(timer.stop()))
        stopper.start()
        stopper.join(DEADLINE)
        stopped = not stopper.is_alive()
        ran_by_then = behind.count
        release.set()
        stopper.join()
        assert stopped, "stop() waited for a run of the executor"
        assert returned == [[]]
        assert ran_by_then == 0
    assert behind.count == 1  # the pool ran it after stop()


def test_executor_inline(make_timer) -> None:
    # Netty's testExecutionOnTaskExecutor: an executor that runs the task at once
    ran = []

    class Inline:
        def submit(self, fn, *args):
            fn(*args)
            ran.append(True)

    timer = make_timer(executor=Inline())
    task = Counter()
    timer.new_timeout(task, 0.01)
    assert task.wait()
    assert wait_for(lambda: ran)


def test_executor_submit_raising_is_logged_and_task_still_runs(make_timer, caplog) -> None:
    class Broken:
        def submit(self, fn, *args):
            raise RuntimeError("executor is shut down")

    caplog.set_level(logging.WARNING, logger="hwtimer")
    timer = make_timer(executor=Broken(), thread_name="broken-exec")
    task = Counter()
    timeout = timer.new_timeout(task, 0)
    assert task.wait()
    time.sleep(0.05)
    assert task.calls == [timeout]
    assert task.threads == ["broken-exec-dispatch"]
    records = [r for r in caplog.records if r.name == "hwtimer"]
    assert len(records) == 1
    assert records[0].levelno == logging.WARNING
    assert records[0].exc_info and isinstance(records[0].exc_info[1], RuntimeError)
    assert "executor is shut down" in caplog.text
    assert timer.stats()["task_errors"] == 1


def test_executor_submit_that_runs_the_task_then_raises_runs_it_once() -> None:
    # The executor ran the task before refusing it: the task is not run a
    # second time on the dispatch thread, and a periodic one, back on the
    # wheel after its run, is not pushed there again (a crash before).
    proc = run_python(
        """
        import time
        import hwtimer

        class RunThenRaise:
            def submit(self, fn, *args):
                fn(*args)
                raise RuntimeError("refused after running")

        timer = hwtimer.HashedWheelTimer(0.01, executor=RunThenRaise())
        runs = []
        p = timer.new_periodic(runs.append, 0.05, delay=0)
        deadline = time.monotonic() + 10
        while len(runs) < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert p.cancel() is True
        time.sleep(0.1)
        assert len(runs) >= 3, runs
        assert timer.pending_timeouts() == 0
        stats = timer.stats()
        assert stats["cancelled"] == 1 and stats["task_errors"] == len(runs), stats
        assert timer.stop() == []
        print("ok")
        """
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "ok"


def test_executor_submit_that_runs_a_one_shot_then_raises_runs_it_once(make_timer, caplog) -> None:
    # The same for a new_timeout() task: the executor ran it, so the
    # refusal is logged and counted, and the dispatch thread does not run
    # it again.
    class RunThenRaise:
        def submit(self, fn, *args):
            fn(*args)
            raise RuntimeError("refused after running")

    caplog.set_level(logging.WARNING, logger="hwtimer")
    timer = make_timer(executor=RunThenRaise())
    task = Counter()
    timeout = timer.new_timeout(task, 0)
    assert wait_for(lambda: timer.stats()["task_errors"] == 1)
    time.sleep(0.05)
    assert task.calls == [timeout]
    records = [r for r in caplog.records if r.name == "hwtimer"]
    assert len(records) == 1
    assert records[0].exc_info and isinstance(records[0].exc_info[1], RuntimeError)
    assert "refused after running" in caplog.text
    assert timer.stats()["task_errors"] == 1


def test_executor_calling_a_one_shot_twice_runs_it_once(make_timer) -> None:
    second: list[BaseException | None] = []

    class Twice:
        def submit(self, fn, *args):
            fn(*args)
            try:
                fn(*args)
            except BaseException as e:  # noqa: BLE001
                second.append(e)
            else:
                second.append(None)

    timer = make_timer(executor=Twice())
    task = Counter()
    timeout = timer.new_timeout(task, 0)
    assert wait_for(lambda: second)
    time.sleep(0.05)
    assert task.calls == [timeout]
    assert isinstance(second[0], RuntimeError), second
    assert "once" in str(second[0])
    assert timer.stats()["task_errors"] == 0


def test_executor_shut_down_pool(make_timer, caplog) -> None:
    caplog.set_level(logging.WARNING, logger="hwtimer")
    pool = concurrent.futures.ThreadPoolExecutor(1)
    pool.shutdown()
    timer = make_timer(executor=pool)
    task = Counter()
    timer.new_timeout(task, 0)
    assert task.wait()
    assert any(r.levelno == logging.WARNING for r in caplog.records if r.name == "hwtimer")


def test_stop_inside_executor_task_is_runtime_error(make_timer) -> None:
    outcome = []
    task = stopping_own_timer(outcome)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        timer = make_timer(executor=pool)
        timer.new_timeout(task, 0)
        assert wait_for(lambda: outcome)
        assert isinstance(outcome[0], RuntimeError)
        timer.stop()


def test_executor_without_submit_is_type_error() -> None:
    with pytest.raises(TypeError):
        HashedWheelTimer(executor=object())
    with pytest.raises(TypeError):
        HashedWheelTimer(executor=lambda fn: fn())

    class NotCallable:
        submit = 1

    with pytest.raises(TypeError):
        HashedWheelTimer(executor=NotCallable())


# ---- context manager ----


def test_context_manager_stops_timer() -> None:
    task = Counter()
    with HashedWheelTimer(0.01, 64) as timer:
        assert isinstance(timer, HashedWheelTimer)
        timer.new_timeout(task, 0)
        pending = timer.new_timeout(task, 60)
        assert task.wait()
    assert pending.is_cancelled()
    with pytest.raises(RuntimeError):
        timer.new_timeout(noop, 0)
    assert timer.stop() == []


def test_context_manager_does_not_swallow_exceptions() -> None:
    with pytest.raises(KeyError):
        with HashedWheelTimer(0.01) as timer:
            timer.new_timeout(noop, 60)
            raise KeyError("x")
    with pytest.raises(RuntimeError):
        timer.new_timeout(noop, 0)


def test_context_manager_returns_the_timer() -> None:
    timer = HashedWheelTimer()
    with timer as entered:
        assert entered is timer


# ---- repr ----


def test_timer_repr(make_timer) -> None:
    timer = make_timer(thread_name="repr-timer")
    text = repr(timer)
    assert "HashedWheelTimer" in text and "repr-timer" in text
    timer.start()
    assert repr(timer) != text
    timer.stop()
    assert "stopped" in repr(timer)


def test_timer_repr_names_a_subclass() -> None:
    """A subclass's timer, and a ManualTimer subclass's, show their own
    class's name, as repr() of Python objects does."""
    from hwtimer.testing import ManualTimer

    class Service(HashedWheelTimer):
        pass

    class Probe(ManualTimer):
        pass

    with Service(0.01, thread_name="svc") as service:
        assert repr(service).startswith("<Service 'svc' not started,")
    with Probe() as probe:
        assert repr(probe).startswith("<Probe '")
    with ManualTimer() as manual:
        assert repr(manual).startswith("<ManualTimer '")
    with HashedWheelTimer(0.01) as plain:
        assert repr(plain).startswith("<HashedWheelTimer '")


class NamedTask:
    def __call__(self, timeout: Timeout) -> None:
        pass

    def __repr__(self) -> str:
        return "<the-named-task>"


def test_timeout_repr(timer) -> None:
    task = NamedTask()
    later = timer.new_timeout(task, 30)
    text = repr(later)
    assert "later" in text and "ago" not in text
    assert "<the-named-task>" in text
    assert "cancelled" not in text
    assert "30" in text or "29.9" in text  # says how far the deadline is

    fired = timer.new_timeout(task, 0)
    assert wait_for(fired.is_expired)
    time.sleep(0.02)
    assert "ago" in repr(fired)
    assert "<the-named-task>" in repr(fired)

    assert later.cancel()
    assert "cancelled" in repr(later)
    assert "<the-named-task>" in repr(later)


def test_timeout_repr_never(timer) -> None:
    text = repr(timer.new_timeout(NamedTask(), float("inf")))
    assert "<the-named-task>" in text


class Connection:
    """Holds its own timeout and shows it in its repr, with no guard of
    its own against the cycle: the timeout's repr shows this task."""

    def __init__(self) -> None:
        self.timeout: Timeout | None = None

    def __call__(self, timeout: Timeout) -> None:
        pass

    def __repr__(self) -> str:
        return f"Connection(timeout={self.timeout!r})"


def test_timeout_repr_of_a_task_that_shows_its_timeout(timer) -> None:
    # As a list that holds itself: the timeout shown again inside its own
    # repr is elided, not a RecursionError (nor in the log of a task error).
    conn = Connection()
    conn.timeout = timer.new_timeout(conn, 30)
    text = repr(conn.timeout)
    assert text.startswith("Timeout(deadline: ") and "later" in text
    assert "task: Connection(timeout=Timeout(...))" in text
    # the clock moves between the two reprs (by a millisecond or more
    # under valgrind or on a busy machine): the time left is not compared
    left = re.compile(r"deadline: \d+\.\d+ s later")
    expected = left.sub("deadline: -", f"Connection(timeout={text})")
    assert left.sub("deadline: -", repr(conn)) == expected
    assert conn.timeout.cancel()
    assert "task: Connection(timeout=Timeout(...))" in repr(conn.timeout)


class FailingConnection(Connection):
    def __call__(self, timeout: Timeout) -> None:
        raise ValueError("connection task failed")


def test_task_error_of_a_task_that_shows_its_timeout_is_logged(timer, caplog) -> None:
    caplog.set_level(logging.WARNING, logger="hwtimer")
    conn = FailingConnection()
    conn.timeout = timer.new_timeout(conn, 0)
    assert wait_for(lambda: timer.stats()["task_errors"] == 1)
    assert wait_for(lambda: [r for r in caplog.records if r.name == "hwtimer"])
    (record,) = [r for r in caplog.records if r.name == "hwtimer"]
    assert "Connection(timeout=Timeout(...))" in record.getMessage()
    assert record.exc_info is not None and record.exc_info[0] is ValueError


class UnshowableTask:
    def __call__(self, timeout: Timeout) -> None:
        raise ValueError("unshowable task failed")

    def __repr__(self) -> str:
        raise RuntimeError("no repr")


def test_task_error_of_a_task_whose_repr_raises_keeps_its_traceback(timer, caplog) -> None:
    # The log line names the task as object.__repr__ would, and the task's
    # own error and traceback are logged, not logging's formatting error.
    caplog.set_level(logging.WARNING, logger="hwtimer")
    task = UnshowableTask()
    timer.new_timeout(task, 0)
    assert wait_for(lambda: [r for r in caplog.records if r.name == "hwtimer"])
    (record,) = [r for r in caplog.records if r.name == "hwtimer"]
    message = record.getMessage()
    # "<test_timer.UnshowableTask object at 0x...": module and qualified name
    assert object.__repr__(task)[:-1] + " (repr() raised RuntimeError)>" in message
    assert record.exc_info is not None and record.exc_info[0] is ValueError
    assert "unshowable task failed" in caplog.text and "Traceback" in caplog.text


# ---- garbage collection and ResourceWarning ----


def test_dropped_started_timer_with_nothing_pending_warns_and_stops() -> None:
    timer = HashedWheelTimer(0.01, thread_name="dropped-timer")
    fired = threading.Event()
    timer.new_timeout(lambda t: fired.set(), 0)
    assert fired.wait(DEADLINE)
    end = time.monotonic() + DEADLINE
    while timer.pending_timeouts() and time.monotonic() < end:
        time.sleep(0.005)
    assert timer.pending_timeouts() == 0
    ref = weakref.ref(timer)
    with pytest.warns(ResourceWarning) as caught:
        del timer
        gc.collect()
        assert wait_for(caught.__len__)
    # the warning's record held the timer; now it goes
    del caught
    assert collect_until(ref)
    assert wait_for(lambda: "dropped-timer" not in native_thread_names())
    assert wait_for(lambda: not [t for t in threading.enumerate() if t.name.startswith("dropped")])


def test_dropped_subclass_with_its_own_del_warns_and_stops() -> None:
    """A subclass's __del__ that does not call the base's leaves the timer
    stopped all the same, with the ResourceWarning."""
    deleted = threading.Event()

    class OwnDel(HashedWheelTimer):
        def __del__(self) -> None:
            deleted.set()

    timer = OwnDel(0.01, thread_name="own-del")
    timer.start()
    ref = weakref.ref(timer)
    with pytest.warns(ResourceWarning) as caught:
        del timer
        gc.collect()
        assert wait_for(caught.__len__)
    assert deleted.is_set()
    assert "unstopped timer" in str(caught[0].message)
    del caught
    assert collect_until(ref)
    assert wait_for(lambda: "own-del" not in native_thread_names())
    assert wait_for(lambda: not [t for t in threading.enumerate() if t.name.startswith("own-del")])


@pytest.mark.parametrize("how", ["dealloc", "cycle"])
def test_dropped_timers_warning_does_not_hand_it_to_its_repr(how) -> None:
    """A running timer that its dealloc (or a collection's clear, for one
    in a cycle) stops, its class's __del__ not calling the base's, is
    being torn down as it warns: a subclass's own __repr__, which could
    keep it, is not called with it there, and the warning shows the
    built-in repr()."""
    proc = run_python(
        """
        import gc, sys, warnings
        import hwtimer

        kept = []

        class Keeps(hwtimer.HashedWheelTimer):
            def __del__(self):
                pass

            def __repr__(self):
                kept.append(self)
                return "<Keeps>"

        warnings.simplefilter("always")
        with warnings.catch_warnings(record=True) as caught:
            timer = Keeps(0.01, thread_name="keeps")
            timer.start()
            if sys.argv[1] == "cycle":
                timer.me = timer
            del timer
            junk = [bytearray(64) for _ in range(10000)]  # over a freed timer
            gc.collect()
        for kept_timer in kept:  # kept there: freed, or cleared
            kept_timer.stop()
        (warning,) = [w for w in caught if w.category is ResourceWarning]
        print(str(warning.message).startswith("unstopped timer <Keeps 'keeps' "), len(kept))
        """,
        args=("-X", "dev"),
        argv=(how,),
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "True 0\n"


def test_exit_hook_during_a_dropped_timers_warning() -> None:
    """The ResourceWarning of a timer that its dealloc stops (a subclass
    whose __del__ does not call the base's) runs Python code while the
    timer is still among the running ones: the atexit hook, which another
    thread may run meanwhile, stops it there and must not free it twice."""
    proc = run_python(
        """
        import gc, warnings
        import hwtimer
        from hwtimer import _hwtimer

        class OwnDel(hwtimer.HashedWheelTimer):
            def __del__(self):
                pass

        def showwarning(*args, **kwargs):
            _hwtimer._stop_all()  # the atexit hook, as at exit

        warnings.simplefilter("always")
        warnings.showwarning = showwarning
        timer = OwnDel(0.01)
        timer.start()
        del timer
        junk = [bytearray(64) for _ in range(10000)]  # over the freed timer
        gc.collect()
        print("ok")
        """,
        args=("-X", "dev"),  # freed memory is overwritten
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "ok\n"


@pytest.mark.parametrize("how", ["never started", "stopped"])
def test_dropped_timer_without_resource_warning(how) -> None:
    timer = HashedWheelTimer(0.01)
    if how == "stopped":
        timer.start()
        timer.stop()
    ref = weakref.ref(timer)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        del timer
        assert collect_until(ref)
    assert not [w for w in caught if issubclass(w.category, ResourceWarning)]


def test_pending_timeouts_keep_a_dropped_timer_alive() -> None:
    fired = threading.Event()
    timer = HashedWheelTimer(0.01, thread_name="kept-alive")
    timer.new_timeout(lambda t: fired.set(), 0.3)
    ref = weakref.ref(timer)
    # once the task has run, nothing keeps the timer: it is collected, with
    # the ResourceWarning of a timer never stopped
    with pytest.warns(ResourceWarning) as caught:
        del timer
        gc.collect()
        assert ref() is not None
        assert fired.wait(DEADLINE)
        assert wait_for(caught.__len__)
    del caught
    assert collect_until(ref)
    assert wait_for(lambda: "kept-alive" not in native_thread_names())


# ---- exceptions from tasks ----


def test_task_exception_is_logged_with_traceback(timer, caplog) -> None:
    caplog.set_level(logging.WARNING, logger="hwtimer")

    def failing_task_xyz(timeout: Timeout) -> None:
        raise ValueError("boom-123")

    timeout = timer.new_timeout(failing_task_xyz, 0)
    assert wait_for(lambda: any(r.name == "hwtimer" for r in caplog.records))
    records = [r for r in caplog.records if r.name == "hwtimer"]
    assert len(records) == 1
    record = records[0]
    assert record.levelno == logging.WARNING
    assert record.exc_info is not None
    assert isinstance(record.exc_info[1], ValueError)
    assert "boom-123" in caplog.text
    assert "Traceback" in caplog.text
    assert "failing_task_xyz" in caplog.text  # the task's own frame
    assert timeout.is_expired()
    # the timer goes on
    task = Counter()
    timer.new_timeout(task, 0)
    assert task.wait()
    assert timer.stats()["task_errors"] == 1


def test_many_task_exceptions_each_logged(timer, caplog) -> None:
    caplog.set_level(logging.WARNING, logger="hwtimer")

    def failing(timeout: Timeout) -> None:
        raise RuntimeError("again")

    for _ in range(20):
        timer.new_timeout(failing, 0)
    assert wait_for(lambda: len([r for r in caplog.records if r.name == "hwtimer"]) == 20)
    task = Counter()
    timer.new_timeout(task, 0)
    assert task.wait()


def test_more_than_64_live_timers_log_one_error() -> None:
    # in a fresh process: the ERROR is logged once per process
    code = """
        import logging, hwtimer
        records = []
        class H(logging.Handler):
            def emit(self, record):
                records.append(record)
        logging.getLogger("hwtimer").addHandler(H())
        timers = []
        for i in range(64):
            t = hwtimer.HashedWheelTimer(1.0)
            t.start()
            timers.append(t)
        unstarted = [hwtimer.HashedWheelTimer(1.0) for _ in range(10)]
        assert records == [], records
        t = hwtimer.HashedWheelTimer(1.0)
        t.start()
        timers.append(t)
        assert len(records) == 1, records
        assert records[0].levelno == logging.ERROR
        for i in range(5):
            t = hwtimer.HashedWheelTimer(1.0)
            t.start()
            timers.append(t)
        assert len(records) == 1, records
        for t in timers:
            t.stop()
        for t in unstarted:
            t.stop()
        print("ok")
    """
    proc = run_python(code)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "ok"


def test_stopped_timers_do_not_count_as_live() -> None:
    code = """
        import logging, hwtimer
        records = []
        class H(logging.Handler):
            def emit(self, record):
                records.append(record)
        logging.getLogger("hwtimer").addHandler(H())
        for i in range(200):
            t = hwtimer.HashedWheelTimer(1.0)
            t.start()
            t.stop()
        with hwtimer.HashedWheelTimer(1.0):
            pass
        assert records == [], records
        print("ok")
    """
    proc = run_python(code)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "ok"


def test_tasks_run_under_threading_trace_hooks(make_timer) -> None:
    # the dispatch thread is a real Python thread: debuggers and profilers
    # installed with threading.settrace() see the tasks
    seen = []

    def traced_task(timeout: Timeout) -> None:
        pass

    def tracer(frame, event, arg):
        if event == "call" and frame.f_code is traced_task.__code__:
            seen.append(threading.current_thread().name)
        return None

    threading.settrace(tracer)
    try:
        timer = make_timer(thread_name="traced")
        timer.start()
    finally:
        threading.settrace(None)
    task_done = Counter()
    timer.new_timeout(traced_task, 0)
    timer.new_timeout(task_done, 0.01)
    assert task_done.wait()
    assert seen == ["traced-dispatch"]
