"""Time that tests control: a manual timer, and asyncio under fake time.

``ManualTimer`` is a ``HashedWheelTimer`` whose core runs the same C wheel in
manual mode: no worker or dispatch thread, and a clock that starts at 0.0 and
moves only when the test calls ``advance()``.  ``use_timer()`` makes
``hwtimer.default_timer()`` (and so the asyncio helpers) return it.
``follow_loop_time()`` makes the asyncio helpers on a real timer put their
deadlines on the event loop's own clock, for fake-time loops such as
looptime's.  The pytest plugin (``hwtimer.pytest_plugin``) wraps these as
fixtures.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import threading
import time
import warnings
from collections.abc import Iterator
from datetime import timedelta
from typing import TYPE_CHECKING, Any, SupportsFloat, SupportsIndex, TypeVar, Union

from . import _default
from ._hwtimer import HashedWheelTimer, _follow_loop_time, _ManualTimer

__all__ = ["ManualTimer", "follow_loop_time", "use_timer"]

_Seconds = Union[float, SupportsFloat, SupportsIndex, timedelta]
_Timer = TypeVar("_Timer", bound=HashedWheelTimer)


class _DefaultInt(int):
    """An int default that __init__ knows by identity: a caller's own 0,
    which is the very object of the literal 0, is not it."""

    __slots__ = ()


class _DefaultFloat(float):
    """A float default that __init__ knows by identity, as _DefaultInt."""

    __slots__ = ()


#: ManualTimer's defaults, which its __new__ applies too; they read and
#: compare as the plain numbers do.
_DEFAULT_TICK = _DefaultFloat(0.001)
_DEFAULT_TICKS = _DefaultInt(4096)
_DEFAULT_MAX_PENDING = _DefaultInt(0)


class _TaskErrors:
    """The ``task_errors`` of a ManualTimer whose subclass's ``__init__``
    did not call ManualTimer's (its timer gets the default settings): a
    list made on first use.  A descriptor with no ``__set__``: the list in
    the instance's ``__dict__`` is read once there.  Not a ``__getattr__``,
    which would also take the ``AttributeError`` raised inside a subclass's
    property for that property missing."""

    def __get__(self, timer: ManualTimer | None, owner: type | None = None) -> Any:
        if timer is None:
            return self
        return timer.__dict__.setdefault("task_errors", [])


class ManualTimer(_ManualTimer):
    """``ManualTimer(tick_duration=0.001, ticks_per_wheel=4096, *,
    max_pending_timeouts=0)``: a ``HashedWheelTimer`` with no threads, whose
    clock (``time()``) starts at 0.0 and moves only by ``advance()``.

    Timeouts run as on a perfectly punctual real timer: a timeout due at
    ``d`` runs at the end of the first tick that ends at or after ``d`` (at
    ``d`` itself on a tick boundary, never before it), in the thread that
    calls ``advance()``, with ``time()`` reading that tick's end.

    ``task_errors`` lists the exceptions its tasks raised (each is also
    logged on the ``"hwtimer"`` logger, as on a real timer); the
    ``manual_timer`` fixture fails a test that leaves any there.
    """

    task_errors: list[BaseException]

    if not TYPE_CHECKING:  # the annotation above is what a checker sees
        task_errors = _TaskErrors()

    def __init__(
        self,
        tick_duration: _Seconds = _DEFAULT_TICK,
        ticks_per_wheel: SupportsIndex = _DEFAULT_TICKS,
        *,
        max_pending_timeouts: SupportsIndex = _DEFAULT_MAX_PENDING,
    ) -> None:
        # Only what is given: a subclass's __new__ may have set the rest,
        # which the defaults, handed on, would undo.
        given: dict[str, Any] = {}
        if tick_duration is not _DEFAULT_TICK:
            given["tick_duration"] = tick_duration
        if ticks_per_wheel is not _DEFAULT_TICKS:
            given["ticks_per_wheel"] = ticks_per_wheel
        if max_pending_timeouts is not _DEFAULT_MAX_PENDING:
            given["max_pending_timeouts"] = max_pending_timeouts
        super().__init__(**given)
        self.task_errors = []

    def _task_failed(self, exc: BaseException) -> None:
        """Called by the timer with each exception a task raised, before it
        is logged."""
        self.task_errors.append(exc)

    async def advance_async(self, seconds: _Seconds) -> int:
        """``advance(seconds)`` from the running loop's thread, yielding to
        the loop until the callbacks and scope expiries that it handed to
        this loop have run, and then until what they set going has settled.
        Returns what ``advance()`` returns.

        It first lets the loop settle, so that tasks created just before the
        call have started (and scheduled their deadlines) when time moves.

        The clock stops at each tick that hands callbacks to this loop while
        they, and the tasks they wake, run: they see that tick's ``time()``,
        and what they schedule before ``seconds`` have passed runs in the
        same call.  An ``advance()`` that they (or another task) make
        meanwhile moves the clock on top of this call's ``seconds``.
        """
        loop = asyncio.get_running_loop()
        # bad input is refused before anything runs, and read once: what
        # is read again below is the float it was read as
        seconds = self._target(seconds)[2]
        await _settle(self, loop)  # tasks made just before take their first step
        # from the clock they leave: one of them may have moved it
        target, carry, _ = self._target(seconds)
        ran = 0
        while True:
            n, reached = self._advance_until(target, carry, loop)
            carry = math.nan  # the clock's now, where others' seconds add to it
            ran += n
            left_at = self._now_ns()
            await _settle(self, loop)
            moved = self._now_ns() - left_at  # by other advances, meanwhile
            if not moved and reached:
                return ran
            # their time comes on top of ours, within the 64-bit ns clock
            target = min(target + moved, _CLOCK_END_NS)


#: The last clock time in ns (the core keeps 2**63 - 1 for "never").
_CLOCK_END_NS = 2**63 - 2

#: How many times advance_async() yields, at most, for the loop to settle:
#: a task that never waits must not hold it for ever.
_SETTLE_STEPS = 100

#: On a loop that hides its ready queue (uvloop), the turns in a row with
#: no task due to step after which advance_async() takes the loop as
#: settled.  A future's done callbacks take a turn of their own to wake the
#: task that awaits it (gather(), shield(), a future a plain callback
#: completes), one more for each callback or future between.
_QUIET_TURNS = 3

#: How long advance_async() waits, at most, for callbacks it handed to the
#: loop to reach it (through the posting thread of a loop that has no
#: add_reader()) before counting the turns it yields for them.
_HANDOVER_WAIT = 10.0


#: A task's _fut_waiter when it has none (not an asyncio task).
_UNSAID = object()


def _task_ready(task: asyncio.Task[object]) -> bool:
    """Whether `task` is due to take a step: made and not started, or woken
    (the future it waits on is done, its wake-up queued)."""
    waiter: Any = getattr(task, "_fut_waiter", _UNSAID)
    if waiter is _UNSAID or task.done():
        return False  # a task that does not say, or done
    return waiter is None or bool(waiter.done())


#: The tasks in _settle() now, on every loop: each yields to the loop, and
#: so is always ready to step; two advance_async() at once must not wait
#: for each other.  Loops in other threads add and discard theirs meanwhile:
#: it is read through copy(), which no other thread interrupts.
_settling: set[Any] = set()


def _others_ready(ready: Any) -> bool:
    """Whether the loop's ready queue holds more than the steps of tasks
    that are settling themselves (and handles cancelled since).  A
    callback's ``__self__`` is told from those tasks by identity: it may be
    any object (a list whose ``append`` a callback is), hashable or not."""
    settling = {id(task) for task in _settling.copy()}
    return any(
        not h._cancelled and id(getattr(h._callback, "__self__", _UNSAID)) not in settling
        for h in list(ready)
    )


async def _settle(timer: ManualTimer, loop: asyncio.AbstractEventLoop) -> None:
    """Yields until the callbacks `timer` handed to `loop` have run and the
    loop has nothing else ready to run.  asyncio's loops (and those built on
    them, looptime's) show their ready queue; for others (uvloop) their
    tasks show whether they are due to step (those woken by the tasks the
    callbacks woke too), and _QUIET_TURNS turns in a row with none due are
    for the callbacks queued there, which may wake one.  Other
    advance_async() calls, settling too, do not count as work."""
    ready = getattr(loop, "_ready", None)
    me = asyncio.current_task()
    if me is not None:
        _settling.add(me)
    try:
        steps = quiet = 0
        handover_end: float | None = None
        while steps < _SETTLE_STEPS:
            await asyncio.sleep(0)
            if timer._holds(loop):
                # A batch on its way: for a loop that cannot watch a
                # descriptor the timer's posting thread, which needs the
                # GIL, hands it over, so wait for it in real time, not in
                # turns of the loop.
                quiet = 0  # what they queue has its turns once they have run
                if handover_end is None:
                    handover_end = time.monotonic() + _HANDOVER_WAIT
                if time.monotonic() >= handover_end:
                    steps += 1
                continue
            steps += 1
            if ready is None:
                if any(_task_ready(t) for t in asyncio.all_tasks(loop) if t not in _settling):
                    quiet = 0
                    continue
                quiet += 1  # a turn for the callbacks they queued, which may wake one
                if quiet <= _QUIET_TURNS:
                    continue
                return
            if not _others_ready(ready):
                return
    finally:
        _settling.discard(me)
    # Given up: the clock moves on before what the tick woke has settled,
    # and a deadline it was about to schedule lands on a later tick.  Said,
    # so that a test does not pass or fail on times that are silently off.
    warnings.warn(
        f"advance_async(): the event loop still had work ready after {_SETTLE_STEPS} "
        f"turns at time() == {timer.time()!r}; the clock moves on without waiting "
        "for it (a task that yields that often between deadlines, or never waits)",
        RuntimeWarning,
        stacklevel=3,
    )


@contextlib.contextmanager
def use_timer(timer: _Timer) -> Iterator[_Timer]:
    """Inside the block, ``hwtimer.default_timer()`` returns `timer`, in
    every thread (and so do ``hwtimer.timeout()``, ``timeout_at()``,
    ``wait_for()`` and ``sleep()`` without ``timer=``).  Blocks nest."""
    if not isinstance(timer, HashedWheelTimer):
        raise TypeError(f"use_timer() takes a HashedWheelTimer, not {type(timer).__name__}")
    # An installation of its own, which its block removes whatever other
    # threads' blocks add and remove meanwhile: each of the list's append()
    # and remove() is one step that no other thread interrupts.
    installed = _default._Installed(timer)
    _default._installed.append(installed)
    try:
        yield timer
    finally:
        _default._installed.remove(installed)


_follow_lock = threading.Lock()
_follow_depth = 0


def _follow_lock_in_child() -> None:
    # a thread of the parent may have held it at the fork, and that thread
    # is not in the child to let it go
    global _follow_lock
    _follow_lock = threading.Lock()


os.register_at_fork(after_in_child=_follow_lock_in_child)


@contextlib.contextmanager
def follow_loop_time() -> Iterator[None]:
    """Inside the block, ``hwtimer.timeout()``, ``timeout_at()``,
    ``wait_for()`` and ``sleep()`` on a real timer put their deadlines on
    the running loop's own ``call_at()``, so that they follow the loop's
    ``time()``: on a fake-time loop (looptime's, or any loop whose
    ``time()`` a test moves) they fire at loop time with no real wait.  On
    a ``ManualTimer`` they stay on its clock.  ``timer.call_later()`` and
    ``new_timeout()`` are not affected.  Blocks nest; the switch is the same
    for every thread."""
    global _follow_depth
    with _follow_lock:
        _follow_depth += 1
        _follow_loop_time(True)
    try:
        yield
    finally:
        with _follow_lock:
            _follow_depth -= 1
            _follow_loop_time(_follow_depth > 0)
