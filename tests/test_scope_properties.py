"""Random programs of nested timeout scopes on a ManualTimer (hypothesis).

A program is a task that nests one to three scopes (``hwtimer.timeout()``,
``timeout_at()``, ``timeout(None)``, a ``timeout()`` made before a sleep
and entered after it, or, from 3.11.3, ``asyncio.timeout()`` among
them), whose bodies sleep (``hwtimer.sleep()``, a ``timer.call_later()``
future, ``hwtimer.wait_for()``), reschedule their own or an outer scope
(earlier, later, into the past, ``None``), touch a scope that has exited,
or wait for ever.  A driver moves the clock with ``advance_async()``,
reschedules scopes while the task waits, and may cancel the task from
outside, directly or from a ``call_later()`` callback that may fall in the
tick of a deadline.

Delays, deadlines and the driver's steps are whole eighths of a tick, on
tick boundaries or inside ticks, and the tick is a power of two of seconds,
so that all of them are exact.  The loop's ``time()`` is the timer's clock,
so that ``when()`` and ``reschedule()`` (absolute, on ``loop.time()``) are
on the clock the deadlines run on; or the loop is a plain one, as under
pytest-asyncio with the ``manual_timer`` fixture, and deadlines are given
as ``loop.time()`` plus the time wanted on the timer's clock.

What is checked is what a user of ``asyncio.timeout()`` relies on: a scope
is cancelled when its deadline passes while its body waits, at the end of
that tick and never before; ``TimeoutError`` comes out of the scope whose
cancellation it was, and of no other; an outside ``cancel()`` stays a
``CancelledError``; ``Task.cancelling()`` is back where it was once a scope
has exited; ``when()`` and ``expired()`` tell what happened; and no
deadline of the library is left on the timer.  From 3.11.3 the same
program whose driver moves the clock by whole ticks also runs with
asyncio's own helpers on a loop whose fake clock moves tick by tick the same
way, and both must give the same trace.
"""

from __future__ import annotations

import asyncio
import math
import sys
from dataclasses import dataclass
from typing import Any, Callable

from conftest import ASYNCIO_TIMEOUT_IS_REFERENCE
from hypothesis import event, given, settings
from hypothesis import strategies as st

import hwtimer
from hwtimer.testing import ManualTimer, use_timer

HAS_CANCELLING = sys.version_info >= (3, 11)

#: How many ticks the driver moves the clock, at most, after its own steps,
#: for the task to finish: more than any program sleeps.
FINISH_TICKS = 200

#: Delays and deadlines are whole numbers of these parts of a tick: on
#: tick boundaries or inside ticks, exact either way.
UNITS_PER_TICK = 8

#: Far enough that a call_later() the test leaves on purpose is still
#: pending when it counts them.
LEFT_UNITS = 10_000 * UNITS_PER_TICK


# ---- programs -------------------------------------------------------------


@dataclass(frozen=True)
class Level:
    kind: str  # "timeout", "timeout_at", "none", "early" or "asyncio"
    delay: int  # units
    early: int  # units slept between making an "early" scope and entering it
    catch: bool  # the code around the scope catches its TimeoutError
    pre: tuple[tuple[Any, ...], ...]  # the body before the inner scope
    post: tuple[tuple[Any, ...], ...]  # the body after it


@dataclass(frozen=True)
class Program:
    tick: float
    ticks_per_wheel: int
    levels: tuple[Level, ...]
    steps: tuple[tuple[Any, ...], ...]  # the driver's
    # whether the driver also moves the clock by parts of a tick (then
    # asyncio's deadlines, on the loop, would fall between ticks: no
    # asyncio.timeout() then, nor a run on asyncio's helpers)
    fine: bool
    # whether the loop is a plain one, whose time() is time.monotonic(), as
    # under pytest-asyncio and the manual_timer fixture: its clock does not
    # move with the timer's, so deadlines are given as loop.time() plus
    # the delay wanted (no asyncio.timeout() then either)
    real_loop: bool


# a few ticks, most often whole ones
units = st.integers(0, 5).map(lambda n: n * UNITS_PER_TICK) | st.integers(0, 5 * UNITS_PER_TICK)
reschedules = st.tuples(
    st.just("reschedule"),
    # which scope (0: the innermost entered, 1: the one around it ...),
    # how, and how many units
    st.integers(0, 2),
    st.sampled_from(["none", "now", "past", "when"]),
    st.integers(-3 * UNITS_PER_TICK, 4 * UNITS_PER_TICK),
)
actions = st.one_of(
    st.tuples(st.just("sleep"), units),
    # (not 0, which is the next tick for a timer, now for asyncio)
    st.tuples(
        st.just("call_later"),
        st.integers(1, 5).map(lambda n: n * UNITS_PER_TICK) | st.integers(1, 5 * UNITS_PER_TICK),
    ),
    st.tuples(st.just("wait_for"), units, units),
    reschedules,
    st.tuples(st.just("reschedule_exited")),
    st.tuples(st.just("leave")),  # a call_later() the test leaves pending
    st.tuples(st.just("forever")),
)


def levels(kinds: list[str]) -> st.SearchStrategy[Level]:
    return st.builds(
        Level,
        kind=st.sampled_from(kinds),
        delay=st.integers(0, 8).map(lambda n: n * UNITS_PER_TICK)
        | st.integers(0, 8 * UNITS_PER_TICK),
        early=units,
        catch=st.booleans(),
        pre=st.lists(actions, max_size=3).map(tuple),
        post=st.lists(actions, max_size=2).map(tuple),
    )


# the driver moves the clock by whole ticks (or not), and reschedules
# scopes while the task waits
whole_steps = st.tuples(st.just("advance"), st.integers(0, 6).map(lambda n: n * UNITS_PER_TICK))
fine_steps = st.tuples(st.just("advance"), st.integers(0, 6 * UNITS_PER_TICK))
cancels = st.tuples(st.just("cancel"))  # by the driver, between its steps
if HAS_CANCELLING:
    # from a call_later() callback, maybe in the tick of a deadline.  Before
    # 3.11 a cancel() made after a scope expired, before the task ran, is
    # reported as TimeoutError, as README.rst says.
    cancels |= st.tuples(st.just("cancel_later"), st.integers(1, 8 * UNITS_PER_TICK))


@st.composite
def programs(draw: Any) -> Program:
    fine, real_loop = draw(st.booleans()), draw(st.booleans())
    driver = draw(st.lists((fine_steps if fine else whole_steps) | reschedules, max_size=6))
    cancel = draw(st.none() | cancels)
    if cancel is not None:  # at most one cancel() from outside
        driver.insert(draw(st.integers(0, len(driver))), cancel)
    # hwtimer's scopes, and asyncio.timeout() among them, which they must
    # combine with as asyncio's own nested scopes do
    kinds = ["timeout", "timeout_at", "none", "early"]
    if ASYNCIO_TIMEOUT_IS_REFERENCE and not fine and not real_loop:
        kinds.append("asyncio")
    return Program(
        tick=draw(st.sampled_from([1.0, 0.25])),
        ticks_per_wheel=draw(st.sampled_from([8, 64])),
        levels=tuple(draw(st.lists(levels(kinds), min_size=1, max_size=3))),
        steps=tuple(driver),
        fine=fine,
        real_loop=real_loop,
    )


# ---- the two worlds a program runs in ------------------------------------


class ClockLoop(asyncio.SelectorEventLoop):
    """An event loop whose time() is `clock()`."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self._clock = clock
        super().__init__()

    def time(self) -> float:
        return self._clock()


async def _settle() -> None:
    """Yields until nothing else is ready to run in the loop."""
    ready = asyncio.get_running_loop()._ready  # type: ignore[attr-defined]
    for _ in range(100):
        await asyncio.sleep(0)
        if not ready:
            return


class HwtimerWorld:
    """hwtimer's helpers on a ManualTimer."""

    def __init__(self, program: Program) -> None:
        self.tick = program.tick
        self.timer = ManualTimer(program.tick, program.ticks_per_wheel)
        # its ticks are counted from its start(): from 0.0, so that they end
        # on whole multiples of the tick, however the driver moves the clock
        self.timer.start()
        # asyncio.timeout()'s deadlines are on the loop, which sees the
        # clock move only where advance_async() stops: at every tick, then
        self.stepwise = any(level.kind == "asyncio" for level in program.levels)
        self.timeout = hwtimer.timeout
        self.timeout_at = hwtimer.timeout_at
        self.sleep = hwtimer.sleep
        self.wait_for = hwtimer.wait_for

    def clock(self) -> float:
        return self.timer.time()

    def call_later(self, units: int, callback: Callable[..., Any], *args: Any) -> Any:
        return self.timer.call_later(units * self.tick / UNITS_PER_TICK, callback, *args)

    async def advance(self, units: int) -> None:
        if not self.stepwise:
            await self.timer.advance_async(units * self.tick / UNITS_PER_TICK)
            return
        for _ in range(units // UNITS_PER_TICK):
            await self.timer.advance_async(self.tick)
        if not units:
            await self.timer.advance_async(0)

    def pending(self) -> int | None:
        return self.timer.pending_timeouts()


if sys.version_info >= (3, 12):
    _ref_wait_for = asyncio.wait_for
else:

    async def _ref_wait_for(aw: Any, timeout: float) -> Any:
        """asyncio.wait_for() of 3.12, which hwtimer.wait_for() follows: a
        timeout scope, or no time at all for a timeout <= 0."""
        if timeout <= 0:
            fut = asyncio.ensure_future(aw)
            if fut.done():
                return fut.result()
            waiter = asyncio.get_running_loop().create_future()
            fut.add_done_callback(lambda _: waiter.done() or waiter.set_result(None))
            fut.cancel()
            await waiter
            try:
                return fut.result()
            except asyncio.CancelledError as exc:
                raise TimeoutError from exc
        async with asyncio.timeout(timeout):  # type: ignore[attr-defined]
            return await aw


class AsyncioWorld:
    """asyncio's own helpers on a loop whose clock only the driver moves,
    tick by tick as a ManualTimer moves its own."""

    def __init__(self, program: Program) -> None:
        self.tick = program.tick
        self.now = 0.0
        self.timeout = asyncio.timeout  # type: ignore[attr-defined]
        self.timeout_at = asyncio.timeout_at  # type: ignore[attr-defined]
        self.sleep = asyncio.sleep
        self.wait_for = _ref_wait_for

    def clock(self) -> float:
        return self.now

    def call_later(self, units: int, callback: Callable[..., Any], *args: Any) -> Any:
        return asyncio.get_running_loop().call_later(
            units * self.tick / UNITS_PER_TICK, callback, *args
        )

    async def advance(self, units: int) -> None:
        await _settle()
        for _ in range(units // UNITS_PER_TICK):
            self.now += self.tick
            await _settle()

    def pending(self) -> int | None:
        return None


# ---- running a program ---------------------------------------------------


@dataclass
class Scope:
    """What became of one scope of a run."""

    level: int
    cm: Any
    when_set: float | None  # the deadline last given to it, on the timer's clock
    when_given: float | None  # the same on loop.time(), as given
    t_set: float = 0.0  # when that was (the entry, or the last reschedule)
    yielded: bool = False  # whether the task yielded since then
    enter_seq: int = 0
    exit_seq: int = 0
    cancelling_before: int | None = None
    cancelling_after: int | None = None
    body_exc: BaseException | None = None
    t_body_exc: float | None = None
    out: BaseException | None = None
    t_exit: float = 0.0
    yielded_at_exit: bool = False
    expired: bool = False
    when: float | None = None


def _set_result_unless_done(fut: asyncio.Future[Any], result: Any) -> None:
    if not fut.done():
        fut.set_result(result)


class Run:
    def __init__(self, program: Program, world: Any) -> None:
        self.program = program
        self.world = world
        self.unit = program.tick / UNITS_PER_TICK
        self.events: list[tuple[Any, ...]] = []
        self.seq = 0
        self.scopes: list[Scope] = []
        self.active: list[Scope] = []  # entered, innermost last
        self.exited: list[Scope] = []
        self.cancel_seqs: list[int] = []
        self.left = 0
        self.errors: list[dict[str, Any]] = []
        self.pending: int | None = None
        self.waits: list[tuple[float, float, float]] = []  # start, end, how long

    def now(self) -> float:
        return self.world.clock()

    def on_loop(self, when: float | None) -> float | None:
        """`when` on the timer's clock as a deadline on loop.time(): the
        same where the loop's clock is the timer's, else as far from
        loop.time() as it is from the timer's time()."""
        if when is None or not self.program.real_loop:
            return when
        return asyncio.get_running_loop().time() + (when - self.now())

    def due(self, start: float, when: float) -> float:
        """When what is due at `when` runs, set at `start`: at once (in the
        next iteration of the loop) if `when` has come, else at the end of
        the tick that `when` falls in (`when` itself on a tick boundary)."""
        if when <= start:
            return start
        return math.ceil(when / self.program.tick) * self.program.tick

    def mark(self, *event: Any) -> int:
        self.seq += 1
        self.events.append((self.now(), *event))
        return self.seq

    def cancelling(self) -> int | None:
        return self.task.cancelling() if HAS_CANCELLING else None

    def yield_(self) -> None:
        """The task is about to yield to the loop."""
        for scope in self.active:
            scope.yielded = True

    async def act(self, level: int, action: tuple[Any, ...]) -> None:
        kind, world, unit = action[0], self.world, self.unit
        start = self.now()
        if kind == "sleep":
            self.yield_()
            await world.sleep(action[1] * unit)
            self.waits.append((start, self.now(), action[1] * unit))
            self.mark("slept", level)
        elif kind == "call_later":
            fut = asyncio.get_running_loop().create_future()
            handle = world.call_later(action[1], _set_result_unless_done, fut, None)
            try:
                self.yield_()
                await fut
            finally:
                handle.cancel()
            self.waits.append((start, self.now(), action[1] * unit))
            self.mark("called", level)
        elif kind == "wait_for":
            _, slept, timeout = action
            self.yield_()
            try:
                result = await world.wait_for(world.sleep(slept * unit, "r"), timeout * unit)
            except TimeoutError:
                # its own deadline, reached first (or in the tick the sleep
                # ends: the cancellation wins, as asyncio's since 3.12)
                assert self.due(start, start + slept * unit) >= self.due(
                    start, start + timeout * unit
                )
                self.waits.append((start, self.now(), timeout * unit))
                self.mark("wait_for timed out", level)
            else:
                assert self.due(start, start + slept * unit) < self.due(
                    start, start + timeout * unit
                )
                assert result == "r"
                self.waits.append((start, self.now(), slept * unit))
                self.mark("wait_for", level, result)
        elif kind == "reschedule":
            self.reschedule(level, *action[1:])
        elif kind == "reschedule_exited":
            if self.exited:
                scope = self.exited[-1]
                try:
                    scope.cm.reschedule(self.now() + unit)
                except RuntimeError:
                    self.mark("reschedule refused", level, scope.level)
                else:
                    self.mark("rescheduled after exit", level, scope.level)
        elif kind == "leave":
            world.call_later(LEFT_UNITS, lambda: None)
            self.left += 1
        else:
            assert kind == "forever"
            self.yield_()
            await asyncio.Event().wait()

    def reschedule(self, level: int, up: int, how: str, n: int) -> None:
        """Reschedules the scope `up` levels out from the innermost entered
        one: from its body (`level` >= 0) or from the driver (-1), while
        the task waits."""
        if not self.active:
            return
        scope = self.active[max(0, len(self.active) - 1 - up)]
        now, unit = self.now(), self.unit
        if how == "none":
            when = None
        elif how == "now":
            when = now + abs(n) * unit
        elif how == "past":
            when = now - (abs(n) + 1) * unit
        else:  # earlier or later than the deadline
            base = scope.when_set
            when = (now if base is None else base) + n * unit
        given = self.on_loop(when)
        scope.cm.reschedule(given)
        scope.when_set, scope.when_given = when, given
        scope.t_set, scope.yielded = now, level < 0
        self.mark("reschedule", level, scope.level, when)

    async def level(self, i: int) -> None:
        spec, world, unit = self.program.levels[i], self.world, self.unit
        now = self.now()
        if spec.kind == "early":
            cm, when = world.timeout(spec.delay * unit), now + spec.delay * unit
            self.yield_()
            await world.sleep(spec.early * unit)
        elif spec.kind == "timeout":
            cm, when = world.timeout(spec.delay * unit), now + spec.delay * unit
        elif spec.kind == "asyncio":
            when = now + spec.delay * unit
            cm = asyncio.timeout(spec.delay * unit)  # type: ignore[attr-defined]
        elif spec.kind == "timeout_at":
            when = now + spec.delay * unit
            cm = world.timeout_at(self.on_loop(when))
        else:
            cm, when = world.timeout(None), None
        scope = Scope(level=i, cm=cm, when_set=when, when_given=cm.when())
        self.scopes.append(scope)
        scope.cancelling_before = self.cancelling()
        try:
            async with cm:
                scope.enter_seq = self.mark("enter", i, scope.when_set)
                scope.t_set, scope.yielded = self.now(), False
                self.active.append(scope)
                try:
                    for action in spec.pre:
                        await self.act(i, action)
                    if i + 1 < len(self.program.levels):
                        if self.program.levels[i + 1].catch:
                            try:
                                await self.level(i + 1)
                            except TimeoutError:
                                self.mark("caught", i)
                        else:
                            await self.level(i + 1)
                    for action in spec.post:
                        await self.act(i, action)
                except BaseException as exc:
                    scope.body_exc, scope.t_body_exc = exc, self.now()
                    raise
                finally:
                    self.active.pop()
        except BaseException as exc:
            scope.out = exc
            raise
        finally:
            scope.t_exit = self.now()
            scope.yielded_at_exit = scope.yielded
            scope.expired, scope.when = cm.expired(), cm.when()
            scope.cancelling_after = self.cancelling()
            scope.exit_seq = self.mark(
                "exit",
                i,
                type(scope.out).__name__ if scope.out else None,
                scope.out is not None and scope.out is not scope.body_exc,  # made here
                scope.expired,
                scope.when,
                scope.cancelling_before,
                scope.cancelling_after,
            )
            self.exited.append(scope)

    async def top(self) -> None:
        if self.program.levels[0].catch:
            try:
                await self.level(0)
            except TimeoutError:
                self.mark("caught", -1)
        else:
            await self.level(0)

    def cancel(self) -> None:
        seq = self.mark("cancel", self.task.cancel())
        if self.events[-1][-1]:  # it reached the task
            self.cancel_seqs.append(seq)

    async def main(self) -> None:
        asyncio.get_running_loop().set_exception_handler(lambda _, ctx: self.errors.append(ctx))
        self.task = asyncio.create_task(self.top())
        handle = None
        for step in self.program.steps:
            if step[0] == "advance":
                await self.world.advance(step[1])
            elif step[0] == "cancel":
                self.cancel()
            elif step[0] == "reschedule":
                self.reschedule(-1, *step[1:])
            else:
                handle = self.world.call_later(step[1], self.cancel)
        for _ in range(FINISH_TICKS):
            if self.task.done():
                break
            await self.world.advance(UNITS_PER_TICK)
        if handle is not None:
            handle.cancel()
        if not self.task.done():  # waits for ever, with no deadline
            self.cancel()
        await asyncio.wait([self.task])
        # the timer counts a cancelled timeout at its next tick
        await self.world.advance(UNITS_PER_TICK)
        self.pending = self.world.pending()
        try:
            self.task.result()
            self.mark("done")
        except BaseException as exc:
            self.mark("raised", type(exc).__name__)


def run(program: Program, world: Any) -> Run:
    result = Run(program, world)
    loop = asyncio.SelectorEventLoop() if program.real_loop else ClockLoop(world.clock)
    try:
        loop.run_until_complete(result.main())
    finally:
        loop.close()
    assert result.errors == []
    return result


# ---- what must hold -----------------------------------------------------


def check_scope(result: Run, scope: Scope) -> None:
    """The rules of asyncio.timeout() that one scope of a run must follow."""
    made_timeout_error = isinstance(scope.out, TimeoutError) and scope.out is not scope.body_exc
    cancels_from_outside = sum(scope.enter_seq < s < scope.exit_seq for s in result.cancel_seqs)
    # when() is the deadline it was given last, on the loop's clock (which
    # is the timer's, but on a plain loop); expired() says whether that
    # deadline cancelled the body
    assert scope.when == scope.when_given
    assert (scope.when is None) == (scope.when_set is None)
    if not result.program.real_loop:
        assert scope.when == scope.when_set
    due = None if scope.when_set is None else result.due(scope.t_set, scope.when_set)
    if scope.expired:
        # never before the deadline, and exactly there (or at once, for one
        # already past when it was set): the tick ends on it
        assert due is not None
        assert isinstance(scope.body_exc, asyncio.CancelledError)
        assert scope.t_body_exc == due
    else:
        # a deadline that passed while the body was waiting cancels it: the
        # body ended before it, or at once where it was set to a time
        # already past, before the body waited (or when a cancel() from
        # outside was already on its way)
        assert (
            due is None
            or due > scope.t_exit
            or (
                due == scope.t_set == scope.t_exit
                and (not scope.yielded_at_exit or cancels_from_outside > 0)
            )
        )
        assert not made_timeout_error
        assert scope.out is scope.body_exc
    # TimeoutError comes out of the scope whose deadline cancelled the task,
    # and of no other: not when an outer scope's deadline cancelled it too
    # (the outer one raises it), nor when a cancel() from outside did
    outer_expired_too = sum(
        outer.expired and outer.body_exc is scope.body_exc
        for outer in result.scopes
        if outer.enter_seq < scope.enter_seq and scope.exit_seq < outer.exit_seq
    )
    assert made_timeout_error == (
        scope.expired and not cancels_from_outside and not outer_expired_too
    )
    if made_timeout_error:
        assert scope.out.__cause__ is scope.body_exc  # type: ignore[union-attr]
    # a CancelledError comes out for each of those, and only then
    still_cancelling = cancels_from_outside + outer_expired_too
    assert isinstance(scope.out, asyncio.CancelledError) == (still_cancelling > 0)
    # and the count of cancel requests is back where it was, but for those
    if HAS_CANCELLING:
        assert scope.cancelling_before is not None and scope.cancelling_after is not None
        assert scope.cancelling_after == scope.cancelling_before + still_cancelling


def check_run(result: Run) -> None:
    assert result.events[-1][1:] in {
        ("done",),
        ("raised", "TimeoutError"),
        ("raised", "CancelledError"),
    }
    # sleep(), a call_later() callback and wait_for() end exactly on time
    for start, end, seconds in result.waits:
        assert end == result.due(start, start + seconds)
    for scope in result.scopes:
        check_scope(result, scope)
        if scope.expired:
            event("a scope expired")
        if isinstance(scope.out, TimeoutError) and scope.out is not scope.body_exc:
            event("a scope raised TimeoutError")
    # a cancel() from outside that reached the task comes out of it as
    # CancelledError
    if any(e[1:] == ("cancel", True) for e in result.events):
        assert result.task.cancelled()
        event("cancelled from outside")
    event(f"the task: {result.events[-1][1:]}")


@settings(deadline=None)
@given(programs())
def test_random_scopes_on_the_manual_clock(program: Program) -> None:
    world = HwtimerWorld(program)
    with use_timer(world.timer):
        try:
            result = run(program, world)
            check_run(result)
            # every deadline of the library is gone, and only what the test
            # left itself is pending
            assert result.pending == result.left
            assert world.timer.task_errors == []
        finally:
            world.timer.stop()
    if ASYNCIO_TIMEOUT_IS_REFERENCE and not program.fine and not program.real_loop:
        reference = run(program, AsyncioWorld(program))
        check_run(reference)  # the rules hold for asyncio itself
        assert result.events == reference.events
