"""Every argument of the public API, fuzzed: whatever a call is given, it
returns, or raises TypeError, ValueError (RuntimeError where documented)
or the exception the argument's own __float__/__index__ raised.  A
refused call changes nothing: pending_timeouts(), stats() counts,
pending_snapshot() and the clock read as before.  Nothing given to a call
stays referenced once the call is refused, or once what it scheduled has
been cancelled and processed.

tests/test_bad_input.py checks chosen values one by one; this runs the
same rules over generated ones, on a ManualTimer (the same argument
parsing as the real timer's, and a clock that stands still)."""

from __future__ import annotations

import asyncio
import datetime
import decimal
import fractions
import gc
import math
import weakref
from typing import Any, Callable

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_bad_input import MyFloat, MyInt, MyStr

import hwtimer
from hwtimer.testing import ManualTimer, use_timer

# 36 tests: each takes half the examples of the profile (conftest.py)
FUZZ = settings(
    max_examples=settings.default.max_examples // 2,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


class Boom(Exception):
    """Raised by the generated objects' own methods: it may propagate."""


class ReprError(Exception):
    """Raised by the generated objects' __repr__: it must not come out."""


#: What a refused call may raise: Boom from the argument's own methods,
#: and a warning that the suite makes an error (CPython's, for an
#: __index__ that returns a bool; hwtimer's, for a tick clamped to 1 ms).
REFUSED = (TypeError, ValueError, Boom, Warning)


class Value:
    """A generated object: weakly referenceable, each behaviour chosen."""

    def __init__(self, payload: object = None, mode: str = "ok", bad_repr: bool = False) -> None:
        self.payload = payload
        self.mode = mode
        self.bad_repr = bad_repr

    def __repr__(self) -> str:
        if self.bad_repr:  # no excuse for an error message to fail
            raise ReprError("__repr__")
        return f"{type(self).__name__}({self.payload!r}, {self.mode!r})"


class FloatLike(Value):
    def __float__(self) -> Any:
        if self.mode == "raise":
            raise Boom("__float__")
        return self.payload


class IndexLike(Value):
    def __index__(self) -> Any:
        if self.mode == "raise":
            raise Boom("__index__")
        return self.payload


class Hostile(Value):
    """Every comparison, hash, bool and call raises."""

    def __eq__(self, other: object) -> bool:
        raise Boom("__eq__")

    def __hash__(self) -> int:
        raise Boom("__hash__")

    def __bool__(self) -> bool:
        raise Boom("__bool__")

    def __lt__(self, other: object) -> bool:
        raise Boom("__lt__")

    __le__ = __gt__ = __ge__ = __lt__

    def __call__(self, *args: object) -> None:
        raise Boom("__call__")


class Recipe:
    """Makes a fresh object on each make(): what hypothesis keeps to
    report and shrink holds only the recipe, so that the test can see
    whether hwtimer keeps the object."""

    def __init__(self, make: Callable[[], object], label: str) -> None:
        self.make = make
        self.label = label

    def __repr__(self) -> str:
        return self.label


INTS = st.one_of(
    st.integers(),
    st.sampled_from([0, 1, -1, 2**30, 2**30 + 1, 2**63 - 1, 2**63, 2**64, -(2**63)]),
    st.sampled_from([10**400, -(10**400)]),
    st.booleans(),
)
FLOATS = st.one_of(
    st.floats(),
    st.sampled_from([math.nan, math.inf, -math.inf, -0.0, 5e-324, 1e-9, 1e308, 9.3e9]),
)
PAYLOADS = st.one_of(INTS, FLOATS, st.none(), st.just("1"), st.just(1j))


def _kept(value: object) -> st.SearchStrategy[Recipe]:
    # an immutable value: the recipe may hold it
    return st.just(Recipe(lambda: value, repr(value)))


def _made(cls: type, *args: object) -> Recipe:
    return Recipe(lambda: cls(*args), f"{cls.__name__}{args!r}")


# past int's repr() limit (4300 digits): made in the test, never shown
HUGE = [Recipe(lambda: 10**5000, "10**5000"), Recipe(lambda: -(10**5000), "-10**5000")]

RECIPES: st.SearchStrategy[Recipe] = st.one_of(
    INTS.flatmap(_kept),
    st.sampled_from(HUGE),
    FLOATS.flatmap(_kept),
    st.text(max_size=4).flatmap(_kept),
    st.sampled_from(["skip", "delay", "burst", "Skip", "", b"skip", None, (), 1j]).flatmap(_kept),
    st.builds(_made, st.just(MyInt), INTS),
    st.builds(_made, st.just(MyFloat), FLOATS),
    st.builds(_made, st.just(MyStr), st.sampled_from(["skip", "1", "x"])),
    st.builds(_made, st.just(FloatLike), PAYLOADS, st.sampled_from(["ok", "raise"]), st.booleans()),
    st.builds(_made, st.just(IndexLike), PAYLOADS, st.sampled_from(["ok", "raise"]), st.booleans()),
    st.builds(_made, st.just(Hostile), st.none(), st.just("ok"), st.booleans()),
    st.builds(_made, st.just(Value), st.none(), st.just("ok"), st.booleans()),
    st.builds(
        _made,
        st.just(datetime.timedelta),
        st.floats(-1e8, 1e8),
    ),
    st.sampled_from(["NaN", "sNaN", "Infinity", "-1", "0.5", "1e999"]).map(
        lambda s: _made(decimal.Decimal, s)
    ),
    st.builds(_made, st.just(fractions.Fraction), st.integers(-9, 9), st.integers(1, 9)),
    st.builds(lambda r: Recipe(lambda: [r.make()], f"[{r!r}]"), st.deferred(lambda: RECIPES)),
)


def noop(*args: object) -> None:
    pass


def state(timer: ManualTimer) -> tuple[object, ...]:
    stats = timer.stats()
    return (
        timer.pending_timeouts(),
        [(id(t), t.deadline) for t in timer.pending_snapshot(1000)],
        stats["scheduled"],
        stats["cancelled"],
        stats["rejected"],
        stats["expired"],
        timer.time(),
    )


def references(obj: object) -> list[weakref.ref[Any]]:
    refs = []
    for item in obj if isinstance(obj, list) else [obj]:
        try:
            refs.append(weakref.ref(item))
        except TypeError:  # int, float, str...: nothing to leak
            pass
    return refs


def assert_released(refs: list[weakref.ref[Any]]) -> None:
    if any(r() is not None for r in refs):
        gc.collect()  # only a cycle left: the generated objects make none
    assert [r() for r in refs if r() is not None] == []


# (what, the call with the fuzzed value in one place): each against a
# ManualTimer holding pending timeouts, and a loop for call_later()
CALLS: list[tuple[str, Callable[[ManualTimer, Any, Any], object]]] = [
    ("new_timeout-task", lambda timer, loop, v: timer.new_timeout(v, 1)),
    ("new_timeout-delay", lambda timer, loop, v: timer.new_timeout(noop, v)),
    ("new_periodic-task", lambda timer, loop, v: timer.new_periodic(v, 1)),
    ("new_periodic-period", lambda timer, loop, v: timer.new_periodic(noop, v)),
    ("new_periodic-delay", lambda timer, loop, v: timer.new_periodic(noop, 1, delay=v)),
    ("new_periodic-missed", lambda timer, loop, v: timer.new_periodic(noop, 1, missed=v)),
    ("call_later-delay", lambda timer, loop, v: timer.call_later(v, noop, loop=loop)),
    ("call_later-callback", lambda timer, loop, v: timer.call_later(1, v, loop=loop)),
    # loop=None outside a running loop: RuntimeError, as documented
    ("call_later-loop", lambda timer, loop, v: timer.call_later(1, noop, loop=v or loop)),
    ("call_later-context", lambda timer, loop, v: timer.call_later(1, noop, loop=loop, context=v)),
    ("call_every-period", lambda timer, loop, v: timer.call_every(v, noop, loop=loop)),
    ("call_every-missed", lambda timer, loop, v: timer.call_every(1, noop, loop=loop, missed=v)),
    ("pending_snapshot-limit", lambda timer, loop, v: timer.pending_snapshot(v)),
    ("reset-delay", lambda timer, loop, v: timer.pending_snapshot(1)[0].reset(v)),
    ("advance-seconds", lambda timer, loop, v: timer.advance(v)),
    ("advance-as-keyword", lambda timer, loop, v: timer.advance(seconds=v)),
    ("new_timeout-extra-argument", lambda timer, loop, v: timer.new_timeout(noop, 1, v)),
    ("cancel-argument", lambda timer, loop, v: timer.pending_snapshot(1)[0].cancel(v)),
    ("stats-argument", lambda timer, loop, v: timer.stats(v)),
    ("advance_to_next-argument", lambda timer, loop, v: timer.advance_to_next(v)),
]


@pytest.fixture
def loop():
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


@pytest.mark.parametrize("call", [c[1] for c in CALLS], ids=[c[0] for c in CALLS])
@FUZZ
@given(recipe=RECIPES)
def test_a_method_refuses_cleanly_or_accepts(loop, call, recipe: Recipe) -> None:
    timer = ManualTimer(0.01, 64)
    timer.new_timeout(noop, 60)
    timer.new_periodic(noop, 1e8)  # an advance() runs it at most 92 times
    before = state(timer)
    value = recipe.make()
    refs = references(value)
    refused = False
    try:
        call(timer, loop, value)
    except REFUSED:
        refused = True
    # outside the except block, whose exception holds the call's frames
    del value
    if refused:
        assert state(timer) == before
    else:
        for timeout in timer.pending_snapshot(1000):
            timeout.cancel()
        timer.advance(0.01)
    assert_released(refs)
    timer.stop()


# the constructor's arguments, each fuzzed in turn
CONSTRUCTORS = [
    ("tick_duration", lambda v: hwtimer.HashedWheelTimer(v, 64)),
    ("ticks_per_wheel", lambda v: hwtimer.HashedWheelTimer(0.01, v)),
    ("max_pending_timeouts", lambda v: hwtimer.HashedWheelTimer(max_pending_timeouts=v)),
    ("thread_name", lambda v: hwtimer.HashedWheelTimer(thread_name=v)),
    ("executor", lambda v: hwtimer.HashedWheelTimer(executor=v)),
    ("manual-tick_duration", lambda v: ManualTimer(v)),
    ("manual-ticks_per_wheel", lambda v: ManualTimer(0.01, v)),
    ("manual-max_pending_timeouts", lambda v: ManualTimer(max_pending_timeouts=v)),
]


@pytest.mark.parametrize("make", [c[1] for c in CONSTRUCTORS], ids=[c[0] for c in CONSTRUCTORS])
@FUZZ
@given(recipe=RECIPES)
def test_the_constructors_refuse_cleanly_or_accept(make, recipe: Recipe) -> None:
    value = recipe.make()
    refs = references(value)
    try:
        timer = make(value)
    except REFUSED:
        pass
    else:
        # never started: nothing to wait for
        assert timer.stop() == []
        del timer
    del value
    assert_released(refs)


# the asyncio helpers: what they are given, and on a ManualTimer the
# clock never moves, so that an accepted sleep is cancelled at once
HELPERS: list[tuple[str, Callable[[Any], Any]]] = [
    ("timeout", lambda v: hwtimer.timeout(v)),
    ("timeout-timer", lambda v: hwtimer.timeout(1, timer=v)),
    ("timeout_at", lambda v: hwtimer.timeout_at(v)),
    ("sleep", lambda v: hwtimer.sleep(v)),
    ("sleep-timer", lambda v: hwtimer.sleep(1, timer=v)),
    ("wait_for-timeout", lambda v: hwtimer.wait_for(_done(), v)),
    ("wait_for-timer", lambda v: hwtimer.wait_for(_done(), 1, timer=v)),
]


def _done() -> asyncio.Future[None]:
    """An awaitable that a refused wait_for() may leave unawaited."""
    future = asyncio.get_running_loop().create_future()
    future.set_result(None)
    return future


async def _use(helper: Callable[[Any], Any], value: object) -> None:
    made = helper(value)
    if isinstance(made, hwtimer.TimeoutScope):
        async with made:
            pass
    else:
        task = asyncio.ensure_future(made)
        await asyncio.sleep(0)
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            pass


@pytest.mark.parametrize("helper", [c[1] for c in HELPERS], ids=[c[0] for c in HELPERS])
@FUZZ
@given(recipe=RECIPES)
def test_the_asyncio_helpers_refuse_cleanly_or_accept(helper, recipe: Recipe) -> None:
    timer = ManualTimer(0.01, 64)
    timer.new_timeout(noop, 60)
    before = state(timer)
    value = recipe.make()
    refs = references(value)

    async def main(value: object) -> None:
        with use_timer(timer):
            try:
                await _use(helper, value)
            except REFUSED:
                pass
            except TimeoutError:  # a deadline already passed
                pass

    asyncio.run(main(value))
    del value
    timer.advance(0.01)  # the scopes' cancels processed
    assert state(timer)[:2] == before[:2]
    assert_released(refs)
    timer.stop()


@FUZZ
@given(recipe=RECIPES)
def test_reschedule_refuses_cleanly_or_accepts(recipe: Recipe) -> None:
    timer = ManualTimer(0.01, 64)
    value = recipe.make()
    refs = references(value)

    async def main(value: object) -> None:
        async with hwtimer.timeout(5, timer=timer) as scope:
            when = scope.when()
            pending = timer.pending_snapshot()
            try:
                scope.reschedule(value)
            except REFUSED:
                assert scope.when() == when
                assert [t.deadline for t in timer.pending_snapshot()] == [
                    t.deadline for t in pending
                ]

    try:
        asyncio.run(main(value))
    except TimeoutError:  # rescheduled into the past
        pass
    del value
    timer.advance(0.01)
    assert timer.pending_timeouts() == 0
    assert_released(refs)
    timer.stop()
