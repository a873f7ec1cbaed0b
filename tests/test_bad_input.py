"""Bad input, table-driven: every public argument with wrong types and
values gets a clear TypeError/ValueError (or its documented outcome),
nothing is scheduled by a refused call, and the timer keeps working.
Also tasks that misbehave: raising KeyboardInterrupt or SystemExit,
dropping the last reference to their own timer."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import datetime
import decimal
import enum
import fractions
import gc
import inspect
import logging
import sys
import threading
import time
import warnings
import weakref
from collections.abc import Iterator
from typing import Any

import pytest
from conftest import (
    DEADLINE,
    Counter,
    HasFloat,
    HasIndex,
    IntFloatsOtherwise,
    collect_until,
    native_thread_names,
    wait_for,
)

import hwtimer
import hwtimer.metrics
from hwtimer import HashedWheelTimer, Timeout
from hwtimer.testing import ManualTimer

NAN = float("nan")
INF = float("inf")


class MyInt(int):
    pass


class MyFloat(float):
    pass


class MyStr(str):
    pass


class MyTimedelta(datetime.timedelta):
    pass


class Color(enum.IntEnum):
    ZERO = 0
    EIGHT = 8


class RaisesFloat:
    """An object whose __float__ raises a given exception."""

    def __init__(self, exc: BaseException) -> None:
        self.exc = exc

    def __float__(self) -> float:
        raise self.exc


class RaisesIndex:
    """An object whose __index__ raises a given exception."""

    def __init__(self, exc: BaseException) -> None:
        self.exc = exc

    def __index__(self) -> int:
        raise self.exc


def raising(exc: BaseException, index: bool) -> object:
    return RaisesIndex(exc) if index else RaisesFloat(exc)


def fresh(exc: BaseException) -> BaseException:
    """A new instance of a parametrized exception: one raised before keeps
    its traceback, and each raise adds to it, so a test run again (as
    scripts/refleaks.sh does) would keep all its earlier frames alive."""
    return type(exc)(*exc.args)


class FloatReturnsStr:
    def __float__(self):
        return "0.5"


class IndexReturnsFloat:
    def __index__(self):
        return 0.5


def noop(timeout: Timeout) -> None:
    pass


# ---- the constructor ----

CONSTRUCTOR_ERRORS = [
    # tick_duration: TypeError for a non-number, ValueError for <= 0, NaN, inf, overflow
    ("tick_duration-bool-True", {"tick_duration": True}, TypeError),
    ("tick_duration-bool-False", {"tick_duration": False}, TypeError),
    ("tick_duration-None", {"tick_duration": None}, TypeError),
    ("tick_duration-str", {"tick_duration": "0.1"}, TypeError),
    ("tick_duration-bytes", {"tick_duration": b"0.1"}, TypeError),
    ("tick_duration-list", {"tick_duration": [0.1]}, TypeError),
    ("tick_duration-complex", {"tick_duration": 0.1j}, TypeError),
    ("tick_duration-object", {"tick_duration": object()}, TypeError),
    ("tick_duration-zero", {"tick_duration": 0}, ValueError),
    ("tick_duration-zero-float", {"tick_duration": 0.0}, ValueError),
    ("tick_duration-negative-zero", {"tick_duration": -0.0}, ValueError),
    ("tick_duration-negative", {"tick_duration": -0.1}, ValueError),
    ("tick_duration-negative-int", {"tick_duration": -1}, ValueError),
    ("tick_duration-nan", {"tick_duration": NAN}, ValueError),
    ("tick_duration-inf", {"tick_duration": INF}, ValueError),
    ("tick_duration--inf", {"tick_duration": -INF}, ValueError),
    ("tick_duration-1e300", {"tick_duration": 1e300}, ValueError),
    ("tick_duration-huge-int-10**100", {"tick_duration": 10**100}, ValueError),
    ("tick_duration-huge-int-10**400", {"tick_duration": 10**400}, ValueError),
    ("tick_duration-huge-myint-10**400", {"tick_duration": MyInt(10**400)}, ValueError),
    ("tick_duration-negative-huge-int", {"tick_duration": -(10**100)}, ValueError),
    ("tick_duration-myfloat-nan", {"tick_duration": MyFloat(NAN)}, ValueError),
    ("tick_duration-myfloat-negative", {"tick_duration": MyFloat(-1.0)}, ValueError),
    ("tick_duration-myint-zero", {"tick_duration": MyInt(0)}, ValueError),
    ("tick_duration-timedelta-zero", {"tick_duration": datetime.timedelta(0)}, ValueError),
    ("tick_duration-timedelta-negative", {"tick_duration": datetime.timedelta(-1)}, ValueError),
    ("tick_duration-timedelta-max", {"tick_duration": datetime.timedelta.max}, ValueError),
    ("tick_duration-decimal-nan", {"tick_duration": decimal.Decimal("NaN")}, ValueError),
    ("tick_duration-float-returns-str", {"tick_duration": FloatReturnsStr()}, TypeError),
    # ticks_per_wheel: TypeError for a non-int, ValueError for <= 0 or > 2**30
    ("ticks_per_wheel-bool", {"ticks_per_wheel": True}, TypeError),
    ("ticks_per_wheel-None", {"ticks_per_wheel": None}, TypeError),
    ("ticks_per_wheel-float", {"ticks_per_wheel": 8.0}, TypeError),
    ("ticks_per_wheel-myfloat", {"ticks_per_wheel": MyFloat(8.0)}, TypeError),
    ("ticks_per_wheel-str", {"ticks_per_wheel": "8"}, TypeError),
    ("ticks_per_wheel-nan", {"ticks_per_wheel": NAN}, TypeError),
    ("ticks_per_wheel-inf", {"ticks_per_wheel": INF}, TypeError),
    ("ticks_per_wheel-timedelta", {"ticks_per_wheel": datetime.timedelta(1)}, TypeError),
    ("ticks_per_wheel-decimal", {"ticks_per_wheel": decimal.Decimal(8)}, TypeError),
    ("ticks_per_wheel-float-only", {"ticks_per_wheel": HasFloat(8.0)}, TypeError),
    ("ticks_per_wheel-zero", {"ticks_per_wheel": 0}, ValueError),
    ("ticks_per_wheel-negative", {"ticks_per_wheel": -1}, ValueError),
    ("ticks_per_wheel-myint-negative", {"ticks_per_wheel": MyInt(-8)}, ValueError),
    ("ticks_per_wheel-too-large", {"ticks_per_wheel": 2**30 + 1}, ValueError),
    ("ticks_per_wheel-huge", {"ticks_per_wheel": 10**100}, ValueError),
    ("ticks_per_wheel-negative-huge", {"ticks_per_wheel": -(10**100)}, ValueError),
    ("ticks_per_wheel-index-huge", {"ticks_per_wheel": HasIndex(2**64)}, ValueError),
    ("ticks_per_wheel-index-returns-float", {"ticks_per_wheel": IndexReturnsFloat()}, TypeError),
    # max_pending_timeouts: TypeError for a non-int
    ("max_pending-bool", {"max_pending_timeouts": True}, TypeError),
    ("max_pending-float", {"max_pending_timeouts": 10.0}, TypeError),
    ("max_pending-nan", {"max_pending_timeouts": NAN}, TypeError),
    ("max_pending-inf", {"max_pending_timeouts": INF}, TypeError),
    ("max_pending-str", {"max_pending_timeouts": "10"}, TypeError),
    ("max_pending-None", {"max_pending_timeouts": None}, TypeError),
    ("max_pending-float-only", {"max_pending_timeouts": HasFloat(10.0)}, TypeError),
    # thread_name: TypeError for a non-str, ValueError for what cannot be a name
    ("thread_name-bytes", {"thread_name": b"name"}, TypeError),
    ("thread_name-int", {"thread_name": 1}, TypeError),
    ("thread_name-bool", {"thread_name": True}, TypeError),
    ("thread_name-list", {"thread_name": ["name"]}, TypeError),
    ("thread_name-nul", {"thread_name": "bad\0name"}, ValueError),
    ("thread_name-surrogate", {"thread_name": "bad\ud800name"}, ValueError),
    # executor: TypeError without a submit()
    ("executor-object", {"executor": object()}, TypeError),
    ("executor-int", {"executor": 1}, TypeError),
    ("executor-str", {"executor": "pool"}, TypeError),
    ("executor-function", {"executor": print}, TypeError),
    ("executor-bool", {"executor": True}, TypeError),
    # wrong calls
    ("unknown-keyword", {"tick": 0.1}, TypeError),
]


@pytest.mark.parametrize(
    "kwargs, exc", [c[1:] for c in CONSTRUCTOR_ERRORS], ids=[c[0] for c in CONSTRUCTOR_ERRORS]
)
def test_constructor_bad_values(kwargs, exc) -> None:
    threads_before = len(native_thread_names())
    with pytest.raises(exc) as info:
        HashedWheelTimer(**kwargs)
    assert type(info.value) is exc or issubclass(type(info.value), exc)
    assert str(info.value)  # a message that says what is wrong
    assert len(native_thread_names()) <= threads_before


def test_a_thread_name_with_a_lone_surrogate_is_refused_by_its_name() -> None:
    """A name that UTF-8 cannot encode (a thread's name is bytes) is a
    ValueError that names thread_name, as its other refusals do, not the
    codec's words alone."""
    with pytest.raises(ValueError, match="thread_name"):
        HashedWheelTimer(thread_name="bad\ud800name")
    timer = HashedWheelTimer()
    with pytest.raises(ValueError, match="thread_name"):
        timer.__init__(thread_name="bad\ud800name")
    assert timer.thread_name.startswith("hwtimer-")
    timer.stop()


@pytest.mark.parametrize("tick", [-(10**400), MyInt(-(10**400))], ids=["int", "myint"])
def test_a_tick_below_any_double_is_refused_as_negative(tick) -> None:
    with pytest.raises(ValueError, match="must be > 0"):
        HashedWheelTimer(tick)


@pytest.mark.parametrize(
    "exc",
    [ZeroDivisionError("float-boom"), LookupError("lookup-boom"), KeyboardInterrupt()],
    ids=["ZeroDivisionError", "LookupError", "KeyboardInterrupt"],
)
@pytest.mark.parametrize("argument", ["tick_duration", "ticks_per_wheel", "max_pending_timeouts"])
def test_constructor_conversion_errors_propagate(argument, exc) -> None:
    exc = fresh(exc)
    bad = raising(exc, index=argument != "tick_duration")
    with pytest.raises(type(exc)) as info:
        HashedWheelTimer(**{argument: bad})
    assert info.value is exc


@pytest.mark.parametrize(
    "exc",
    [ZeroDivisionError("submit-boom"), KeyboardInterrupt()],
    ids=["ZeroDivisionError", "KeyboardInterrupt"],
)
def test_an_error_reading_the_executors_submit_propagates(exc) -> None:
    exc = fresh(exc)

    # Only an AttributeError means "has no submit()": anything else that
    # reading it raises is the caller's to see, as getattr() would show it.
    class Executor:
        @property
        def submit(self):
            raise exc

    threads_before = len(native_thread_names())
    with pytest.raises(type(exc)) as info:
        HashedWheelTimer(executor=Executor())
    assert info.value is exc
    assert len(native_thread_names()) <= threads_before


class ThreadPerTask:
    """An executor of the user's own, not a concurrent.futures.Executor."""

    def submit(self, fn, *args):
        threading.Thread(target=fn, args=args, daemon=True).start()


@pytest.mark.parametrize(
    "cls",
    [concurrent.futures.ThreadPoolExecutor, concurrent.futures.ProcessPoolExecutor, ThreadPerTask],
)
def test_an_executor_class_instead_of_an_executor_is_refused(cls) -> None:
    # The class has a submit() too, but as an unbound method: every task's
    # submit(fn, timeout) would take fn for self and the Timeout for fn.
    # An Executor's would fail, be logged, and run the task on the dispatch
    # thread instead; ThreadPerTask's would start a thread that calls the
    # Timeout and dies, the task never run nor logged.  The mistake is
    # refused where it is made.
    threads_before = len(native_thread_names())
    with pytest.raises(TypeError, match=rf"not the class {cls.__name__}.*{cls.__name__}\(\)"):
        HashedWheelTimer(executor=cls)
    assert len(native_thread_names()) <= threads_before


def test_a_class_with_a_static_submit_is_still_an_executor() -> None:
    ran = threading.Event()

    class Inline:
        @staticmethod
        def submit(fn, *args):
            fn(*args)

    with HashedWheelTimer(0.01, executor=Inline) as timer:
        timer.new_timeout(lambda t: ran.set(), 0)
        assert ran.wait(10)


def test_a_class_whose_metaclass_gives_submit_is_still_an_executor() -> None:
    ran = threading.Event()

    class Submits(type):
        def __getattr__(cls, name):
            if name == "submit":
                return lambda fn, *args: fn(*args)
            raise AttributeError(name)

    class Inline(metaclass=Submits):
        pass

    with HashedWheelTimer(0.01, executor=Inline) as timer:
        timer.new_timeout(lambda t: ran.set(), 0)
        assert ran.wait(10)


CONSTRUCTOR_ACCEPTED = [
    ("tick_duration-myint", {"tick_duration": MyInt(1)}, "tick_duration", 1.0),
    ("tick_duration-myfloat", {"tick_duration": MyFloat(0.5)}, "tick_duration", 0.5),
    ("tick_duration-intenum", {"tick_duration": Color.EIGHT}, "tick_duration", 8.0),
    ("tick_duration-has-float", {"tick_duration": HasFloat(0.25)}, "tick_duration", 0.25),
    ("tick_duration-has-index", {"tick_duration": HasIndex(2)}, "tick_duration", 2.0),
    ("tick_duration-decimal", {"tick_duration": decimal.Decimal("0.5")}, "tick_duration", 0.5),
    ("tick_duration-fraction", {"tick_duration": fractions.Fraction(1, 4)}, "tick_duration", 0.25),
    (
        "tick_duration-timedelta-subclass",
        {"tick_duration": MyTimedelta(milliseconds=50)},
        "tick_duration",
        0.05,
    ),
    ("ticks_per_wheel-myint", {"ticks_per_wheel": MyInt(100)}, "ticks_per_wheel", 128),
    ("ticks_per_wheel-intenum", {"ticks_per_wheel": Color.EIGHT}, "ticks_per_wheel", 8),
    ("ticks_per_wheel-has-index", {"ticks_per_wheel": HasIndex(5)}, "ticks_per_wheel", 8),
    ("ticks_per_wheel-limit", {"ticks_per_wheel": 2**20}, "ticks_per_wheel", 2**20),
    ("max_pending-myint", {"max_pending_timeouts": MyInt(5)}, "max_pending_timeouts", 5),
    ("max_pending-has-index", {"max_pending_timeouts": HasIndex(5)}, "max_pending_timeouts", 5),
    ("max_pending-intenum", {"max_pending_timeouts": Color.EIGHT}, "max_pending_timeouts", 8),
    ("thread_name-subclass", {"thread_name": MyStr("sub-name")}, "thread_name", "sub-name"),
    ("thread_name-None", {"thread_name": None}, None, None),
    ("executor-None", {"executor": None}, None, None),
]


@pytest.mark.parametrize(
    "kwargs, attr, expected",
    [c[1:] for c in CONSTRUCTOR_ACCEPTED],
    ids=[c[0] for c in CONSTRUCTOR_ACCEPTED],
)
def test_constructor_accepted(make_timer, kwargs, attr, expected) -> None:
    kwargs = dict(kwargs)
    timer = make_timer(
        kwargs.pop("tick_duration", 0.01), kwargs.pop("ticks_per_wheel", 64), **kwargs
    )
    if attr is not None:
        assert getattr(timer, attr) == pytest.approx(expected)
    if timer.tick_duration <= 0.5:
        task = Counter()
        timer.new_timeout(task, 0)
        assert task.wait()


class NameOfItsOwn(str):
    """A str subclass whose repr and comparisons are not the string's."""

    def __repr__(self) -> str:
        raise RuntimeError("__repr__")

    def __eq__(self, other: object) -> bool:
        return True

    __hash__ = str.__hash__


@pytest.mark.parametrize("given_to", ["__new__", "__init__"])
def test_a_str_subclass_thread_name_is_kept_as_its_string(make_timer, given_to) -> None:
    """thread_name is the string a str subclass holds: the timer's
    thread_name is a plain str, which its repr() shows and the exporters
    compare, not the subclass, whose own methods would speak for it."""
    timer = make_timer(thread_name=NameOfItsOwn("own-name"))
    if given_to == "__init__":  # a subclass's __init__ may rename a new timer
        timer = make_timer()
        timer.__init__(0.01, 64, thread_name=NameOfItsOwn("own-name"))
    assert type(timer.thread_name) is str and timer.thread_name == "own-name"
    assert "'own-name'" in repr(timer)
    other = make_timer(thread_name="other-name")
    hwtimer.metrics.PrometheusCollector(timer, other)  # two names, no collision
    task = Counter()
    timer.new_timeout(task, 0)
    assert task.wait()
    assert "own-name-dispatch" in [t.name for t in threading.enumerate()]


def test_an_int_subclass_is_its_int_value_in_every_argument(make_timer) -> None:
    # Its value is the int's, whatever its __float__ says, for delays as
    # for time.sleep() and float arithmetic: for tick_duration too.
    timer = make_timer(IntFloatsOtherwise(2))
    assert timer.tick_duration == 2.0
    timeout = timer.new_timeout(noop, IntFloatsOtherwise(3))
    assert timeout.deadline - time.monotonic() <= 3
    timeout.cancel()
    with ManualTimer() as manual:
        manual.advance(IntFloatsOtherwise(1))
        assert manual.time() == 1.0


@pytest.mark.parametrize("limit", [10**100, 2**63, 2**64, HasIndex(10**30)])
def test_huge_max_pending_is_no_limit_in_practice(make_timer, limit) -> None:
    timer = make_timer(max_pending_timeouts=limit)
    assert timer.max_pending_timeouts >= 2**62
    timeouts = [timer.new_timeout(noop, 60) for _ in range(1000)]
    assert timer.pending_timeouts() == 1000
    for t in timeouts:
        t.cancel()


@pytest.mark.parametrize("limit", [-(10**100), -1, MyInt(-5)])
def test_negative_max_pending_is_no_limit(make_timer, limit) -> None:
    timer = make_timer(max_pending_timeouts=limit)
    assert timer.max_pending_timeouts <= 0
    timeouts = [timer.new_timeout(noop, 60) for _ in range(1000)]
    assert timer.pending_timeouts() == 1000
    for t in timeouts:
        t.cancel()


# ---- new_timeout(): refused calls schedule nothing ----


def assert_nothing_scheduled_and_still_working(timer, before_pending, before_scheduled) -> None:
    assert timer.pending_timeouts() == before_pending
    assert timer.stats()["scheduled"] == before_scheduled
    task = Counter()
    timeout = timer.new_timeout(task, 0)
    assert task.wait()
    assert task.calls == [timeout]


@pytest.fixture
def busy_timer(timer):
    """A started timer that already holds a few pending timeouts."""
    timer.new_timeout(noop, 60)
    timer.new_timeout(noop, 120)
    return timer


BAD_DELAYS = [
    ("bool-True", True, TypeError),
    ("bool-False", False, TypeError),
    ("None", None, TypeError),
    ("str", "1", TypeError),
    ("mystr", MyStr("1"), TypeError),
    ("bytes", b"1", TypeError),
    ("list", [1], TypeError),
    ("dict", {}, TypeError),
    ("complex", 1j, TypeError),
    ("object", object(), TypeError),
    ("function", noop, TypeError),
    ("float-returns-str", FloatReturnsStr(), TypeError),
    ("index-returns-float", IndexReturnsFloat(), TypeError),
    ("date", datetime.date(2020, 1, 1), TypeError),
    ("nan", NAN, ValueError),
    ("negative-nan", -NAN, ValueError),
    ("myfloat-nan", MyFloat(NAN), ValueError),
    ("has-float-nan", HasFloat(NAN), ValueError),
    ("decimal-nan", decimal.Decimal("NaN"), ValueError),
    ("decimal-snan", decimal.Decimal("sNaN"), ValueError),
]


@pytest.mark.parametrize("delay, exc", [c[1:] for c in BAD_DELAYS], ids=[c[0] for c in BAD_DELAYS])
def test_bad_delay(busy_timer, delay, exc) -> None:
    timer = busy_timer
    pending, scheduled = timer.pending_timeouts(), timer.stats()["scheduled"]
    task = Counter()
    with pytest.raises(exc) as info:
        timer.new_timeout(task, delay)
    assert str(info.value)
    time.sleep(0.03)
    assert task.count == 0
    assert_nothing_scheduled_and_still_working(timer, pending, scheduled)


CONVERSION_ERRORS = [
    ("ZeroDivisionError-from-__float__", ZeroDivisionError("float-boom"), False),
    ("LookupError-from-__float__", LookupError("lookup-boom"), False),
    ("ValueError-from-__float__", ValueError("value-boom"), False),
    ("KeyboardInterrupt-from-__float__", KeyboardInterrupt(), False),
    ("ZeroDivisionError-from-__index__", ZeroDivisionError("index-boom"), True),
    ("RuntimeError-from-__index__", RuntimeError("index-boom"), True),
    ("overflow-from-__float__", OverflowError("mine"), False),
]


@pytest.mark.parametrize(
    "exc, index", [c[1:] for c in CONVERSION_ERRORS], ids=[c[0] for c in CONVERSION_ERRORS]
)
def test_delay_conversion_errors_propagate(busy_timer, exc, index) -> None:
    exc = fresh(exc)
    timer = busy_timer
    pending, scheduled = timer.pending_timeouts(), timer.stats()["scheduled"]
    with pytest.raises(type(exc)) as info:
        timer.new_timeout(noop, raising(exc, index))
    assert info.value is exc
    assert_nothing_scheduled_and_still_working(timer, pending, scheduled)


class TooBigToCompare(RaisesFloat):
    """Past any float (its __float__ raises OverflowError), and its
    comparison with 0, which gives such a number its sign, raises."""

    def __init__(self, exc: BaseException) -> None:
        super().__init__(OverflowError("too big"))
        self.compare_exc = exc

    def __gt__(self, other: object) -> bool:
        raise self.compare_exc

    __lt__ = __gt__


@pytest.mark.parametrize(
    "exc, raised",
    [(ZeroDivisionError("cmp-boom"), OverflowError), (KeyboardInterrupt(), KeyboardInterrupt)],
    ids=["ZeroDivisionError", "KeyboardInterrupt"],
)
def test_a_number_too_big_to_compare_keeps_ctrl_c(busy_timer, exc, raised) -> None:
    """A number too big for a float whose sign cannot be read is refused
    with the OverflowError that says so; but a KeyboardInterrupt raised
    while its sign is read is the user's Ctrl-C, and stands."""
    timer = busy_timer
    pending, scheduled = timer.pending_timeouts(), timer.stats()["scheduled"]
    with pytest.raises(raised):
        timer.new_timeout(noop, TooBigToCompare(fresh(exc)))
    assert_nothing_scheduled_and_still_working(timer, pending, scheduled)


class FloatReprRaises(HasFloat):
    def __repr__(self) -> str:
        raise ZeroDivisionError("repr-boom")


class IndexReprRaises(HasIndex):
    def __repr__(self) -> str:
        raise ZeroDivisionError("repr-boom")


class StrReprRaises(str):
    """A str whose repr() and str() raise: a message shows its characters
    all the same, and the error is still the documented one."""

    def __repr__(self) -> str:
        raise ZeroDivisionError("repr-boom")

    def __str__(self) -> str:
        raise ZeroDivisionError("str-boom")


HUGE = 10**5000  # more digits than int's repr() gives by default (4300)

# A value refused with ValueError is named in the message; one whose
# repr() fails (or an int too long for repr()) is still refused with that
# ValueError, not with what repr() raised.
UNSHOWABLE_VALUES = [
    ("tick-repr-raises", lambda timer: HashedWheelTimer(FloatReprRaises(0.0)), "tick_duration"),
    ("tick-huge-negative", lambda timer: HashedWheelTimer(-HUGE), "tick_duration"),
    (
        "ticks_per_wheel-repr-raises",
        lambda timer: HashedWheelTimer(0.1, IndexReprRaises(-1)),
        "ticks_per_wheel",
    ),
    ("ticks_per_wheel-huge", lambda timer: HashedWheelTimer(0.1, HUGE), "ticks_per_wheel"),
    (
        "manual-tick-repr-raises",
        lambda timer: ManualTimer(FloatReprRaises(-1.0)),
        "tick_duration",
    ),
    ("period-repr-raises", lambda timer: timer.new_periodic(noop, FloatReprRaises(0.0)), "period"),
    ("period-huge-negative", lambda timer: timer.new_periodic(noop, -HUGE), "period"),
    (
        "missed-repr-raises",
        lambda timer: timer.new_periodic(noop, 1, missed=StrReprRaises("never")),
        "missed",
    ),
    ("missed-huge", lambda timer: timer.new_periodic(noop, 1, missed=HUGE), "missed"),
    ("limit-repr-raises", lambda timer: timer.pending_snapshot(IndexReprRaises(-1)), "limit"),
    ("limit-huge-negative", lambda timer: timer.pending_snapshot(-HUGE), "limit"),
    ("advance-repr-raises", lambda timer: timer.advance(FloatReprRaises(-1.0)), "seconds"),
    ("advance-huge-negative", lambda timer: timer.advance(-HUGE), "seconds"),
]


@pytest.mark.parametrize(
    "call, name", [c[1:] for c in UNSHOWABLE_VALUES], ids=[c[0] for c in UNSHOWABLE_VALUES]
)
def test_a_value_that_cannot_be_shown_is_still_a_value_error(call, name) -> None:
    with ManualTimer(0.01, 64) as timer:
        timer.new_timeout(noop, 60)
        state = timer.pending_snapshot(), timer.stats()["scheduled"], timer.time()
        with pytest.raises(ValueError, match=rf"^{name} must be .*, not "):
            call(timer)
        assert (timer.pending_snapshot(), timer.stats()["scheduled"], timer.time()) == state


BAD_TASKS = [
    ("None", None),
    ("int", 1),
    ("str", "noop"),
    ("object", object()),
    ("list", [noop]),
]


@pytest.mark.parametrize("task", [c[1] for c in BAD_TASKS], ids=[c[0] for c in BAD_TASKS])
def test_task_not_callable(busy_timer, task) -> None:
    timer = busy_timer
    pending, scheduled = timer.pending_timeouts(), timer.stats()["scheduled"]
    with pytest.raises(TypeError) as info:
        timer.new_timeout(task, 0)
    assert "callable" in str(info.value)
    assert_nothing_scheduled_and_still_working(timer, pending, scheduled)


def test_bad_task_and_bad_delay_schedule_nothing_on_a_fresh_timer(make_timer) -> None:
    timer = make_timer()
    for args in [(None, 0), (noop, None), (noop, NAN), (noop, True)]:
        with pytest.raises((TypeError, ValueError)):
            timer.new_timeout(*args)
    assert timer.pending_timeouts() == 0
    assert timer.stop() == []


BAD_CALLS = [
    ("no-arguments", (), {}),
    ("missing-delay", (noop,), {}),
    ("missing-task", (), {"delay": 1}),
    ("too-many", (noop, 1, 2), {}),
    ("unknown-keyword", (noop, 1), {"when": 1}),
    ("unknown-keyword-only", (), {"task": noop, "delay": 1, "extra": 1}),
    ("task-twice", (noop,), {"task": noop, "delay": 1}),
    ("delay-twice", (noop, 1), {"delay": 1}),
]


@pytest.mark.parametrize("args, kwargs", [c[1:] for c in BAD_CALLS], ids=[c[0] for c in BAD_CALLS])
def test_new_timeout_bad_calls(busy_timer, args, kwargs) -> None:
    timer = busy_timer
    pending, scheduled = timer.pending_timeouts(), timer.stats()["scheduled"]
    with pytest.raises(TypeError):
        timer.new_timeout(*args, **kwargs)
    assert_nothing_scheduled_and_still_working(timer, pending, scheduled)


# Every method binds its arguments with the one parser: (method, the
# arguments of a good call).
SIGNATURES = [
    ("new_timeout", (noop, 1), {}),
    ("new_periodic", (noop, 1), {"delay": 1}),
    ("call_later", (1, noop), {"loop": None}),
    ("call_every", (1, noop), {"missed": "skip"}),
    ("pending_snapshot", (), {"limit": 1}),
]


@pytest.mark.parametrize("name", [str, StrReprRaises], ids=["str", "unprintable"])
@pytest.mark.parametrize("method, args, kwargs", SIGNATURES, ids=[s[0] for s in SIGNATURES])
def test_every_method_refuses_an_unknown_keyword(busy_timer, method, args, kwargs, name) -> None:
    timer = busy_timer
    pending, scheduled = timer.pending_timeouts(), timer.stats()["scheduled"]
    with pytest.raises(
        TypeError, match=rf"^{method}\(\) got an unexpected keyword argument 'extra'$"
    ):
        getattr(timer, method)(*args, **kwargs, **{name("extra"): 1})
    assert_nothing_scheduled_and_still_working(timer, pending, scheduled)


@pytest.mark.parametrize("name", [str, StrReprRaises], ids=["str", "unprintable"])
def test_a_keyword_given_by_position_too_is_refused(busy_timer, name) -> None:
    timer = busy_timer
    pending, scheduled = timer.pending_timeouts(), timer.stats()["scheduled"]
    with pytest.raises(
        TypeError, match=r"^new_timeout\(\) got multiple values for argument 'delay'$"
    ):
        timer.new_timeout(noop, 1, **{name("delay"): 2})
    assert_nothing_scheduled_and_still_working(timer, pending, scheduled)


# call_later() and call_every() take *args
FIXED_ARITY = [s for s in SIGNATURES if not s[0].startswith("call_")]


@pytest.mark.parametrize("method, args, kwargs", FIXED_ARITY, ids=[s[0] for s in FIXED_ARITY])
def test_every_method_refuses_too_many_positional_arguments(
    busy_timer, method, args, kwargs
) -> None:
    timer = busy_timer
    pending, scheduled = timer.pending_timeouts(), timer.stats()["scheduled"]
    with pytest.raises(TypeError, match=rf"^{method}\(\) takes .*positional argument"):
        getattr(timer, method)(*args, 1, 2, 3)
    assert_nothing_scheduled_and_still_working(timer, pending, scheduled)


def test_positional_only_arguments_are_refused_as_keywords(busy_timer) -> None:
    timer = busy_timer
    with pytest.raises(
        TypeError, match=r"^call_later\(\) got an unexpected keyword argument 'delay'$"
    ):
        timer.call_later(delay=1, callback=noop)
    with pytest.raises(TypeError, match=r"^call_every\(\) missing required argument 'callback'$"):
        timer.call_every(1, delay=1)


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda: HashedWheelTimer(0.1, 16, 0), r"^HashedWheelTimer\(\) takes at most 2 positional"),
        (lambda: HashedWheelTimer(0.1, tick_duration=0.1), r"multiple values for argument"),
        (lambda: HashedWheelTimer(thread="x"), r"unexpected keyword argument 'thread'"),
    ],
)
def test_constructor_binds_as_the_methods_do(make, message) -> None:
    with pytest.raises(TypeError, match=message):
        make()


@pytest.mark.parametrize("method", ["start", "stop", "pending_timeouts", "stats", "__enter__"])
def test_timer_methods_take_no_arguments(busy_timer, method) -> None:
    timer = busy_timer
    pending = timer.pending_timeouts()
    with pytest.raises(TypeError):
        getattr(timer, method)(1)
    assert_nothing_scheduled_and_still_working(timer, pending, timer.stats()["scheduled"])


@pytest.mark.parametrize("nargs", [0, 1, 2, 4])
@pytest.mark.parametrize("manual", [False, True], ids=["real", "manual"])
def test_exit_refuses_a_wrong_number_of_arguments(make_timer, manual, nargs) -> None:
    """__exit__ takes exc_type, exc and tb: called otherwise it is not the
    with statement calling it, and the timer is not stopped for good."""
    timer = ManualTimer(0.01, 64) if manual else make_timer()
    pending = timer.new_timeout(noop, 60)
    with pytest.raises(TypeError, match="__exit__"):
        timer.__exit__(*[None] * nargs)
    assert timer.pending_timeouts() == 1 and not pending.is_cancelled()
    ran = Counter()
    timer.new_timeout(ran, 0)
    if manual:
        timer.advance(0.02)
    assert ran.wait()
    assert timer.__exit__(None, None, None) is False
    assert pending.is_cancelled()


@pytest.mark.parametrize("method", ["cancel", "is_cancelled", "is_expired"])
def test_timeout_methods_take_no_arguments(timer, method) -> None:
    timeout = timer.new_timeout(noop, 60)
    with pytest.raises(TypeError):
        getattr(timeout, method)(True)
    assert not timeout.is_cancelled()
    assert timer.pending_timeouts() == 1


# ---- delays with a documented outcome ----

SOON = [
    ("zero", 0),
    ("negative", -1),
    ("negative-zero", -0.0),
    ("-inf", -INF),
    ("negative-huge-int", -(10**100)),
    ("negative-1e300", -1e300),
    ("myint", MyInt(0)),
    ("myfloat-negative", MyFloat(-1.5)),
    ("intenum", Color.ZERO),
    ("decimal", decimal.Decimal("0.01")),
    ("fraction", fractions.Fraction(1, 100)),
    ("has-float", HasFloat(0.01)),
    ("has-index", HasIndex(0)),
    ("has-index-negative-huge", HasIndex(-(10**400))),
    ("fraction-negative-huge", fractions.Fraction(-(10**400))),
    ("timedelta", datetime.timedelta(milliseconds=10)),
    ("timedelta-negative", datetime.timedelta(days=-1)),
    ("timedelta-min", datetime.timedelta.min),
    ("timedelta-subclass", MyTimedelta(milliseconds=10)),
]


@pytest.mark.parametrize("delay", [c[1] for c in SOON], ids=[c[0] for c in SOON])
def test_delay_fires_soon(timer, delay) -> None:
    task = Counter()
    timeout = timer.new_timeout(task, delay)
    assert timeout.deadline != INF
    assert task.wait()
    assert task.calls == [timeout]
    assert task.times[0] >= timeout.deadline


NEVER = [
    ("inf", INF),
    ("myfloat-inf", MyFloat(INF)),
    ("1e300", 1e300),
    ("max-float", 1.7976931348623157e308),
    ("huge-int-10**100", 10**100),
    ("huge-int-10**400", 10**400),
    ("myint-10**400", MyInt(10**400)),
    ("int64-max", 2**63 - 1),
    ("decimal-infinity", decimal.Decimal("Infinity")),
    ("has-float-inf", HasFloat(INF)),
    ("has-index-huge", HasIndex(10**400)),
    ("fraction-huge", fractions.Fraction(10**400)),
    ("timedelta-max", datetime.timedelta.max),
]


@pytest.mark.parametrize("delay", [c[1] for c in NEVER], ids=[c[0] for c in NEVER])
def test_delay_never_fires(timer, delay) -> None:
    task = Counter()
    timeout = timer.new_timeout(task, delay)
    assert timeout.deadline == INF
    assert timer.pending_timeouts() == 1
    probe = Counter()
    timer.new_timeout(probe, 0)
    assert probe.wait()
    time.sleep(0.05)
    assert task.count == 0
    assert timer.stop() == [timeout]


def test_a_number_past_any_float_is_infinite_wherever_seconds_are_read() -> None:
    """A number that is no int and too large for a float (a Fraction,
    whose __float__ raises OverflowError) is infinite by its sign, as an
    int is: a delay or period that never falls due, a deadline passed long
    ago, or a tick and an advance out of range (ValueError)."""
    huge, tiny = fractions.Fraction(10**400), fractions.Fraction(-(10**400))
    with pytest.raises(ValueError, match="tick_duration"):
        ManualTimer(huge)
    timer = ManualTimer()
    timeout = timer.new_timeout(noop, 1)
    assert timeout.reset(huge) and timeout.deadline == INF
    assert timer.new_periodic(noop, huge).deadline == INF
    assert timer.new_periodic(noop, 1, delay=huge).deadline == INF
    with pytest.raises(ValueError, match="seconds"):
        timer.advance(huge)

    async def main() -> None:
        async with hwtimer.timeout(huge, timer=timer) as cm:
            assert cm.when() == INF
        async with hwtimer.timeout_at(huge, timer=timer) as cm:
            await timer.advance_async(1)
        assert not cm.expired()
        with pytest.raises(TimeoutError):
            async with hwtimer.timeout(tiny, timer=timer):
                await asyncio.sleep(DEADLINE)
        assert await hwtimer.wait_for(asyncio.sleep(0, "done"), huge, timer=timer) == "done"
        await hwtimer.sleep(tiny, timer=timer)

    try:
        asyncio.run(main())
    finally:
        timer.stop()


@pytest.mark.parametrize(
    "tiny",
    [fractions.Fraction(1, 10**400), decimal.Decimal("1e-400")],
    ids=["fraction", "decimal"],
)
def test_a_number_above_0_below_any_float_is_above_0(tiny) -> None:
    """A number above 0 that no float can hold reads as 0.0 by its
    __float__; it is still above 0, as 1e-320 is: a tick that is clamped
    (with the warning), a period of a ns, not a value refused as <= 0."""
    with pytest.warns(RuntimeWarning, match="clamped"):
        timer = ManualTimer(tiny)
    with timer:
        assert timer.tick_duration == 0.001
        ran: list[Timeout] = []
        timeout = timer.new_periodic(ran.append, tiny, missed="skip")
        assert timer.advance(0.0025) == 2 and ran == [timeout, timeout]


class TimedeltaOfItsOwn(datetime.timedelta):
    """A timedelta whose own days, seconds and total_seconds() are not
    the time it holds."""

    @property
    def days(self) -> float:  # type: ignore[override]
        return datetime.timedelta.total_seconds(self) / 86400

    @property
    def seconds(self) -> int:  # type: ignore[override]
        raise RuntimeError("seconds")

    def total_seconds(self) -> float:
        raise RuntimeError("total_seconds")


def test_a_timedelta_subclass_is_the_time_it_holds() -> None:
    """A timedelta subclass is the time it holds, as timedelta's own
    arithmetic reads it, whatever its own days, seconds or total_seconds()
    say: a delay, a period, a reset, an advance, a tick, a scope's delay."""
    delay = TimedeltaOfItsOwn(milliseconds=1500)
    assert ManualTimer(delay).tick_duration == 1.5
    timer = ManualTimer()
    assert timer.new_timeout(noop, delay).deadline == 1.5
    assert timer.new_periodic(noop, delay).deadline == 1.5
    timeout = timer.new_timeout(noop, 60)
    assert timeout.reset(delay) and timeout.deadline == 1.5
    assert timer.advance(delay) == 3 and timer.time() == 1.5

    async def main() -> None:
        loop = asyncio.get_running_loop()
        async with hwtimer.timeout(delay, timer=timer) as cm:
            assert cm.when() == pytest.approx(loop.time() + 1.5)
        assert await hwtimer.wait_for(asyncio.sleep(0, "done"), delay, timer=timer) == "done"

    try:
        asyncio.run(main())
    finally:
        timer.stop()


# ---- misbehaving tasks ----


@pytest.mark.parametrize("exc_type", [KeyboardInterrupt, SystemExit, GeneratorExit])
def test_task_raising_base_exception_is_logged_and_timer_goes_on(timer, caplog, exc_type) -> None:
    caplog.set_level(logging.WARNING, logger="hwtimer")

    def task(timeout: Timeout) -> None:
        raise exc_type("from-a-task")

    for _ in range(3):
        timer.new_timeout(task, 0)
    assert wait_for(lambda: len([r for r in caplog.records if r.name == "hwtimer"]) >= 3)
    records = [r for r in caplog.records if r.name == "hwtimer"]
    assert len(records) == 3
    for record in records:
        assert record.levelno == logging.WARNING
        assert record.exc_info and isinstance(record.exc_info[1], exc_type)
    follow = Counter()
    timer.new_timeout(follow, 0.01)
    assert follow.wait()
    assert timer.stats()["task_errors"] == 3
    # the dispatch thread is alive and the main thread was not interrupted
    assert any(t.name == timer.thread_name + "-dispatch" for t in threading.enumerate())


def test_task_with_wrong_signature_is_logged(timer, caplog) -> None:
    caplog.set_level(logging.WARNING, logger="hwtimer")
    timer.new_timeout(lambda: None, 0)
    assert wait_for(lambda: any(r.name == "hwtimer" for r in caplog.records))
    record = next(r for r in caplog.records if r.name == "hwtimer")
    assert isinstance(record.exc_info[1], TypeError)
    follow = Counter()
    timer.new_timeout(follow, 0)
    assert follow.wait()


def test_task_dropping_last_reference_to_its_timer() -> None:
    holder = {}
    done = threading.Event()

    def task(timeout: Timeout) -> None:
        holder.clear()  # the last reference to the timer outside hwtimer
        done.set()

    holder["timer"] = HashedWheelTimer(0.01, thread_name="self-drop")
    holder["timer"].new_timeout(task, 0.02)
    ref = weakref.ref(holder["timer"])
    with pytest.warns(ResourceWarning) as caught:
        assert done.wait(DEADLINE)
        assert wait_for(caught.__len__)
    del caught  # its records held the timer
    assert collect_until(ref)
    assert wait_for(lambda: "self-drop" not in native_thread_names())
    assert wait_for(
        lambda: not [t for t in threading.enumerate() if t.name.startswith("self-drop")]
    )
    # timers go on working
    with HashedWheelTimer(0.01) as timer:
        follow = Counter()
        timer.new_timeout(follow, 0)
        assert follow.wait()


def test_task_dropping_last_reference_loses_nothing_pending() -> None:
    holder = {}
    fired = Counter()

    def task(timeout: Timeout) -> None:
        holder.clear()

    holder["timer"] = HashedWheelTimer(0.01, thread_name="drop-pending")
    holder["timer"].new_timeout(task, 0)
    expected = 20
    for i in range(expected):
        holder["timer"].new_timeout(lambda t: fired(None), 0.05 + i * 0.01)
    ref = weakref.ref(holder["timer"])
    with pytest.warns(ResourceWarning) as caught:
        assert fired.wait(expected)
        assert wait_for(caught.__len__)
    del caught
    assert collect_until(ref)
    assert fired.count == expected
    assert wait_for(lambda: "drop-pending" not in native_thread_names())


def test_task_on_executor_dropping_last_reference_to_its_timer() -> None:
    holder = {}
    done = threading.Event()

    def task(timeout: Timeout) -> None:
        holder.clear()
        done.set()

    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        holder["timer"] = HashedWheelTimer(0.01, thread_name="exec-drop", executor=pool)
        holder["timer"].new_timeout(task, 0)
        ref = weakref.ref(holder["timer"])
        with pytest.warns(ResourceWarning) as caught:
            assert done.wait(DEADLINE)
            assert wait_for(caught.__len__)
        del caught
        assert collect_until(ref)
    assert wait_for(lambda: "exec-drop" not in native_thread_names())


def test_task_that_raises_and_drops_its_timer() -> None:
    # The log record would keep the timeout, and so the timer, alive: keep
    # only a summary of it.
    seen = []

    class Summary(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.append((record.levelno, record.exc_info[0] if record.exc_info else None))

    logger = logging.getLogger("hwtimer")
    handler = Summary()
    propagate = logger.propagate
    logger.addHandler(handler)
    logger.propagate = False
    try:
        holder = {}

        def task(timeout: Timeout) -> None:
            holder.clear()
            raise KeyboardInterrupt

        holder["timer"] = HashedWheelTimer(0.01)
        holder["timer"].new_timeout(task, 0)
        ref = weakref.ref(holder["timer"])
        with pytest.warns(ResourceWarning) as caught:
            assert wait_for(lambda: seen)
            assert wait_for(caught.__len__)
        del caught
        assert collect_until(ref)
    finally:
        logger.removeHandler(handler)
        logger.propagate = propagate
    assert seen == [(logging.WARNING, KeyboardInterrupt)]


def test_run_task_refuses_what_was_not_submitted(timer) -> None:
    """_run_task() is what a timer submits to its executor; given a timeout
    that is still pending it refuses, and the timeout goes on as
    scheduled (a periodic one pushed again while on the wheel would have
    been linked twice)."""
    from hwtimer import _hwtimer

    ran = Counter()
    periodic = timer.new_periodic(ran, 0.05)
    once = timer.new_timeout(ran, 60)
    for timeout in (periodic, once):
        with pytest.raises(RuntimeError, match="submitted"):
            _hwtimer._run_task(timeout)
    with pytest.raises(TypeError):
        _hwtimer._run_task(object())
    assert ran.count == 0 and timer.pending_timeouts() == 2
    assert wait_for(lambda: ran.count >= 3)  # on its grid, once a run
    assert periodic.cancel() and once.cancel()


class LoopWithoutPosting:
    """Answers is_closed() as a loop does, but has no call_soon_threadsafe(),
    which the timer posts to a loop's thread with: no event loop."""

    def is_closed(self) -> bool:
        return False


class LoopWithUncallablePost(LoopWithoutPosting):
    call_soon_threadsafe = 5


@pytest.mark.parametrize("loop_type", [LoopWithoutPosting, LoopWithUncallablePost])
@pytest.mark.parametrize("started", [False, True], ids=["new-timer", "started-timer"])
def test_a_loop_that_takes_no_posts_is_refused_before_anything_starts(started, loop_type) -> None:
    timer = HashedWheelTimer(0.01, thread_name="no-post-loop")
    try:
        if started:
            timer.start()
        threads_before = len(native_thread_names())
        for method in (timer.call_later, timer.call_every):
            with pytest.raises(TypeError, match="loop must be an asyncio event loop"):
                method(1, print, loop=loop_type())
        # a new timer stays unstarted: no worker, no dispatch thread
        assert len(native_thread_names()) <= threads_before
        assert timer.stats()["scheduled"] == 0 and timer.pending_timeouts() == 0
    finally:
        timer.stop()


def test_no_running_loop_is_told_in_the_callers_terms() -> None:
    # call_later() and call_every() take loop=, and say so; timeout() has
    # no such parameter, and says what asyncio.timeout() says.
    timer = ManualTimer()
    with pytest.raises(RuntimeError, match="no running event loop: pass loop="):
        timer.call_later(1, print)
    with pytest.raises(RuntimeError, match="no running event loop: pass loop="):
        timer.call_every(1, print)
    for delay in (1, 0, -1, None):
        with pytest.raises(RuntimeError, match="no running event loop") as caught:
            hwtimer.timeout(delay, timer=timer)
        assert "loop=" not in str(caught.value)
    assert timer.pending_timeouts() == 0


# ---- every refused call leaves the timer as it was ----


class NotAwaitable:
    """Neither a coroutine, nor a future, nor anything with __await__."""


def plain_generator():
    yield  # a generator, not a coroutine: await refuses it


NOT_AWAITABLE = NotAwaitable()
GENERATOR = plain_generator()


def call_later_on_a_closed_loop(timer, arg):
    loop = asyncio.new_event_loop()
    loop.close()
    return timer.call_later(1, arg, loop=loop)


# (id, the argument refused, the call made with it in a running loop (its
# coroutine, if it returns one, is awaited), the error)
REFUSED_CALLS = [
    # wait_for() of what cannot be awaited, whatever the timeout
    *[
        (
            f"wait_for-{name}-timeout-{timeout}",
            arg,
            lambda timer, arg, timeout=timeout: hwtimer.wait_for(arg, timeout, timer=timer),
            TypeError,
        )
        for name, arg in [
            ("int", 1),
            ("None", None),
            ("str", "aw"),
            ("object", NOT_AWAITABLE),
            ("function", noop),
            ("generator", GENERATOR),
        ]
        for timeout in (1, 0.5, INF, 0, -1, None)
    ],
    ("wait_for-timeout-nan", NAN, lambda timer, arg: hwtimer.wait_for(_done(), arg), ValueError),
    ("wait_for-timeout-str", "1", lambda timer, arg: hwtimer.wait_for(_done(), arg), TypeError),
    (
        "wait_for-timer",
        NOT_AWAITABLE,
        lambda timer, arg: hwtimer.wait_for(_done(), 1, timer=arg),
        TypeError,
    ),
    ("sleep-nan", NAN, lambda timer, arg: hwtimer.sleep(arg, timer=timer), ValueError),
    ("sleep-str", "1", lambda timer, arg: hwtimer.sleep(arg, timer=timer), TypeError),
    ("sleep-timer", NOT_AWAITABLE, lambda timer, arg: hwtimer.sleep(1, timer=arg), TypeError),
    ("timeout-nan", NAN, lambda timer, arg: hwtimer.timeout(arg, timer=timer), ValueError),
    ("timeout-bool", True, lambda timer, arg: hwtimer.timeout(arg, timer=timer), TypeError),
    ("timeout-timer", NOT_AWAITABLE, lambda timer, arg: hwtimer.timeout(1, timer=arg), TypeError),
    ("timeout_at-nan", NAN, lambda timer, arg: hwtimer.timeout_at(arg, timer=timer), ValueError),
    ("timeout_at-str", "1", lambda timer, arg: hwtimer.timeout_at(arg, timer=timer), TypeError),
    ("new_timeout-task", NOT_AWAITABLE, lambda timer, arg: timer.new_timeout(arg, 1), TypeError),
    ("new_timeout-delay", NAN, lambda timer, arg: timer.new_timeout(noop, arg), ValueError),
    ("new_periodic-period", -1, lambda timer, arg: timer.new_periodic(noop, arg), ValueError),
    (
        "new_periodic-missed",
        "never",
        lambda timer, arg: timer.new_periodic(noop, 1, missed=arg),
        ValueError,
    ),
    ("call_later-callback", NOT_AWAITABLE, lambda timer, arg: timer.call_later(1, arg), TypeError),
    ("call_later-delay", NAN, lambda timer, arg: timer.call_later(arg, noop), ValueError),
    (
        "call_later-loop",
        NOT_AWAITABLE,
        lambda timer, arg: timer.call_later(1, noop, loop=arg),
        TypeError,
    ),
    ("call_later-closed-loop", noop, call_later_on_a_closed_loop, RuntimeError),
    (
        "call_later-context",
        {},
        lambda timer, arg: timer.call_later(1, noop, context=arg),
        TypeError,
    ),
    ("call_every-period", 0, lambda timer, arg: timer.call_every(arg, noop), ValueError),
    ("call_every-delay", NAN, lambda timer, arg: timer.call_every(1, noop, delay=arg), ValueError),
    ("reset-nan", NAN, lambda timer, arg: timer.pending_snapshot()[0].reset(arg), ValueError),
    ("reset-str", "1", lambda timer, arg: timer.pending_snapshot()[0].reset(arg), TypeError),
    ("advance-negative", -1, lambda timer, arg: timer.advance(arg), ValueError),
    ("advance-nan", NAN, lambda timer, arg: timer.advance(arg), ValueError),
    ("advance_async-negative", -1, lambda timer, arg: timer.advance_async(arg), ValueError),
    ("pending_snapshot-negative", -1, lambda timer, arg: timer.pending_snapshot(arg), ValueError),
    # keyword misuse
    (
        "timeout-unknown-keyword",
        NOT_AWAITABLE,
        lambda timer, arg: hwtimer.timeout(1, timer=timer, loop=arg),
        TypeError,
    ),
    (
        "wait_for-unknown-keyword",
        NOT_AWAITABLE,
        lambda timer, arg: hwtimer.wait_for(_done(), 1, timer=timer, loop=arg),
        TypeError,
    ),
    (
        "call_later-delay-by-keyword",
        NOT_AWAITABLE,
        lambda timer, arg: timer.call_later(callback=noop, delay=1, extra=arg),
        TypeError,
    ),
    (
        "reset-unknown-keyword",
        1,
        lambda timer, arg: timer.pending_snapshot()[0].reset(when=arg),
        TypeError,
    ),
    (
        "new_periodic-unknown-keyword",
        NOT_AWAITABLE,
        lambda timer, arg: timer.new_periodic(noop, 1, when=arg),
        TypeError,
    ),
]


def _done() -> asyncio.Future[None]:
    future = asyncio.get_running_loop().create_future()
    future.set_result(None)
    return future


#: What a refused call must leave as it was in a real timer's stats(): all
#: but what moves with time alone (ticks, wake-ups, lateness).
COUNTS = ("pending", "scheduled", "expired", "cancelled", "rejected", "task_errors", "never_due")


def counts(timer: HashedWheelTimer) -> object:
    """What a refused call must leave as it was: all of a ManualTimer's
    stats() and clock; a real timer's counts, and its threads."""
    if isinstance(timer, ManualTimer):
        return timer.stats(), timer.time()
    stats = timer.stats()
    return [stats[key] for key in COUNTS], sorted(native_thread_names())


def _refused_call_params() -> Iterator[Any]:
    """Each refused call on a ManualTimer and on a real timer, but the
    advances, which only a ManualTimer has (left out, not skipped)."""
    for name, arg, call, exc in REFUSED_CALLS:
        for manual in (True, False):
            if manual or not any(n.startswith("advance") for n in call.__code__.co_names):
                kind = "manual" if manual else "real"
                yield pytest.param(manual, arg, call, exc, id=f"{name}-{kind}")


@pytest.mark.parametrize("manual, arg, call, exc", list(_refused_call_params()))
def test_a_refused_call_changes_nothing(make_timer, caplog, manual, arg, call, exc) -> None:
    """Nothing counted in stats(), nothing pending, no thread started, no
    reference kept to what was refused, nothing logged, and the timer goes
    on working."""
    caplog.set_level(logging.DEBUG, logger="hwtimer")
    if manual:
        timer = ManualTimer(0.01, 64)
        timer.new_timeout(noop, 60)
        timer.advance(0.05)
    else:
        timer = make_timer()
        timer.new_timeout(noop, 60)
        # its dispatch thread: started with the first task that falls due
        first = Counter()
        timer.new_timeout(first, 0)
        assert first.wait()

    def references() -> int:
        # shared objects (small ints, None, interned strings) are counted
        # everywhere; the rest only here and by whoever holds them
        shared = type(arg) in (int, float, str, bool, type(None))
        return 0 if shared else sys.getrefcount(arg)

    async def main() -> tuple[type[BaseException] | None, str]:
        await asyncio.sleep(0)
        gc.collect()
        before = counts(timer), timer.pending_snapshot(), references()
        raised: tuple[type[BaseException] | None, str] = (None, "")
        made = None
        try:
            made = call(timer, arg)
            if inspect.isawaitable(made):
                await made
        except BaseException as caught:  # noqa: BLE001  (checked below)
            raised = (type(caught), str(caught))
            del caught  # its traceback holds the frames that hold `arg`
        del made
        for _ in range(3):
            await asyncio.sleep(0)
        gc.collect()
        after = counts(timer), timer.pending_snapshot(), references()
        assert after == before
        return raised

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        raised, message = asyncio.run(main())
    assert raised is exc, message
    assert message
    assert not [r for r in caplog.records if r.name == "hwtimer"]
    ran = Counter()
    timeout = timer.new_timeout(ran, 0.02)
    if manual:
        timer.advance(0.03)
    assert ran.wait()
    assert ran.calls == [timeout]
    timer.stop()


@pytest.mark.parametrize("timeout", [1, INF, 0, -1, None])
def test_wait_for_refuses_a_future_of_another_loop(timeout) -> None:
    """Refused at once, as asyncio.wait_for() of 3.11 refuses it: not left
    waiting for ever for a cancellation that the other loop would deliver,
    nor after a deadline scheduled and cancelled for nothing."""
    timer = ManualTimer(0.01, 64)
    other = asyncio.new_event_loop()
    try:
        future = other.create_future()

        async def main() -> None:
            before = timer.stats(), timer.pending_snapshot()
            with pytest.raises(ValueError, match="different loop"):
                await asyncio.wait_for(hwtimer.wait_for(future, timeout, timer=timer), DEADLINE)
            assert (timer.stats(), timer.pending_snapshot()) == before

        asyncio.run(main())
        assert not future.done()  # the other loop's future is left alone
    finally:
        other.close()
        timer.stop()


@pytest.mark.parametrize("cause", ["stopped", "full"])
def test_a_scope_refused_on_entry_is_left_as_it_was(cause) -> None:
    """A scope whose deadline the timer refuses (stopped, or full) raises
    on entry and stays a scope not yet entered: it holds no task, it says
    so, and it can be entered once the timer takes its deadline."""
    timer = ManualTimer(0.01, 64, max_pending_timeouts=1)
    blocker = timer.new_timeout(noop, 60)
    if cause == "stopped":
        timer.stop()

    async def main() -> None:
        task = asyncio.current_task()
        scope = hwtimer.timeout(1, timer=timer)
        refs = sys.getrefcount(task)
        error = "stopped timer" if cause == "stopped" else "max_pending_timeouts"
        for _ in range(2):  # the same error each time, not "already entered"
            with pytest.raises(RuntimeError, match=error):
                async with scope:
                    pytest.fail("entered a scope with no deadline")
        assert sys.getrefcount(task) == refs  # the scope keeps no task
        assert not scope.expired()
        with pytest.raises(RuntimeError, match="has not been entered"):
            scope.reschedule(None)
        if cause == "full":
            blocker.cancel()
            timer.advance(0.01)
            with pytest.raises(TimeoutError):
                async with scope:
                    await timer.advance_async(2)
            assert scope.expired()

    asyncio.run(main())
    timer.stop()


@pytest.mark.parametrize("delay", [None, 0], ids=["no-deadline", "deadline-passed"])
def test_a_reschedule_the_timer_refuses_keeps_the_deadline(delay) -> None:
    """reschedule() to a deadline that a full timer refuses raises
    RejectedExecutionError and leaves the scope as it was: its when(), and
    its expiry (none, or at once for a deadline already passed).  (A
    deadline on the wheel frees its place for the new one.)"""
    timer = ManualTimer(0.01, 64, max_pending_timeouts=1)

    async def main() -> None:
        loop = asyncio.get_running_loop()
        expiry = pytest.raises(TimeoutError) if delay is not None else contextlib.nullcontext()
        with expiry:
            async with hwtimer.timeout(delay, timer=timer) as scope:
                when = scope.when()
                timer.new_timeout(noop, 60)  # the timer is full
                with pytest.raises(hwtimer.RejectedExecutionError):
                    scope.reschedule(loop.time() + 5)
                assert scope.when() == when
                for _ in range(3):
                    await asyncio.sleep(0)
        assert scope.expired() is (delay is not None)

    asyncio.run(main())
    timer.stop()


class SaysOnce:
    """A deadline whose __float__ gives it once, and `later` after: NaN, a
    time far off, or an error."""

    def __init__(self, when: float, later: object) -> None:
        self.when = when
        self.later = later
        self.reads = 0

    def __float__(self) -> float:
        self.reads += 1
        if self.reads == 1:
            return self.when
        if isinstance(self.later, BaseException):
            raise fresh(self.later)
        return self.later  # type: ignore[return-value]


@pytest.mark.parametrize("stop", [False, True], ids=["on-the-wheel", "timer-stopped"])
@pytest.mark.parametrize("how", ["timeout_at", "reschedule"])
@pytest.mark.parametrize(
    "later", [NAN, 1e9, ValueError("read again")], ids=["nan", "far", "raises"]
)
def test_a_scope_keeps_the_deadline_it_read(later, how, stop) -> None:
    """A deadline that is neither int nor float is read once, when the
    scope is given it: entering the scope, its repr() and the stop() of
    its timer (which moves the deadline to the loop's clock) keep what was
    read, rather than calling its __float__ again, which may say something
    else then, or raise: the scope expires at that deadline, not before."""
    timer = HashedWheelTimer(0.01)

    async def main() -> None:
        loop = asyncio.get_running_loop()
        when = SaysOnce(loop.time() + 0.2, later)
        with pytest.raises(TimeoutError):
            async with hwtimer.timeout_at(when if how == "timeout_at" else None, timer=timer) as cm:
                if how == "reschedule":
                    cm.reschedule(when)
                assert repr(cm).startswith("<TimeoutScope [active] when=")
                if stop:
                    timer.stop()
                await asyncio.sleep(DEADLINE)
        assert loop.time() >= when.when
        assert cm.when() is when and when.reads == 1

    try:
        asyncio.run(main())
    finally:
        timer.stop()


@pytest.mark.parametrize(
    "later", [NAN, 100.0, ValueError("read again")], ids=["nan", "far", "raises"]
)
def test_advance_async_reads_its_seconds_once(later) -> None:
    """advance_async() refuses bad seconds before it lets the loop run,
    and then moves the clock by the seconds it read then: it does not call
    their __float__ again, which may say something else, or raise, after
    the loop has run."""
    timer = ManualTimer()
    timer.new_timeout(noop, 1)

    async def main() -> None:
        seconds = SaysOnce(0.5, later)
        assert await timer.advance_async(seconds) == 0
        assert timer.time() == 0.5 and seconds.reads == 1

    try:
        asyncio.run(main())
    finally:
        timer.stop()


@pytest.mark.parametrize("loop_refuses", [False, True], ids=["on-the-loop", "loop-refuses"])
def test_a_reschedule_whose_old_place_is_taken_keeps_the_deadline_on_the_loop(
    loop_refuses: bool,
) -> None:
    """reschedule() cancels the old deadline before it asks for the new
    one, and reads loop.time() in between: Python code, where another
    thread can take the place the cancel freed on a full timer.  The new
    deadline is then refused, and so is the old one when it goes back: the
    scope keeps it on the loop's clock rather than naming a deadline that
    nothing will keep.  Should the loop refuse it too, when() says the
    scope has none."""
    timer = HashedWheelTimer(0.001, 64, max_pending_timeouts=1)

    class Loop(asyncio.SelectorEventLoop):
        fill = False
        refuse = False

        def time(self) -> float:
            if self.fill:  # another thread's schedule, at the worst moment
                self.fill = False
                timer.new_timeout(noop, 60)
            return super().time()

        def call_at(self, *args: Any, **kwargs: Any) -> asyncio.TimerHandle:
            if self.refuse:
                raise RuntimeError("refused")
            return super().call_at(*args, **kwargs)

    async def main() -> None:
        loop = asyncio.get_running_loop()
        assert isinstance(loop, Loop)
        expiry = contextlib.nullcontext() if loop_refuses else pytest.raises(TimeoutError)
        with expiry:
            async with hwtimer.timeout(0.2, timer=timer) as scope:
                when, later = scope.when(), loop.time() + 5
                loop.fill = True
                loop.refuse = loop_refuses
                with pytest.raises(hwtimer.RejectedExecutionError):
                    scope.reschedule(later)
                loop.refuse = False
                assert scope.when() == (None if loop_refuses else when)
                await asyncio.sleep(0.5 if loop_refuses else 5)
        assert scope.expired() is not loop_refuses

    loop = Loop()
    try:
        loop.run_until_complete(main())
    finally:
        loop.close()
        timer.stop()
