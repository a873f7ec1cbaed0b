"""asyncio on a HashedWheelTimer: timeout scopes, wait_for() and sleep().

The deadlines live on the timer's wheel (``timer.call_later``) instead of the
event loop's heap of TimerHandles, and expiry is delivered to the loop thread
in batches by the binding.  Everything else follows asyncio: ``timeout()`` and
``timeout_at()`` behave as ``asyncio.timeout()`` of Python 3.13, including the
``Task.cancelling()`` / ``Task.uncancel()`` accounting that lets nested scopes
and outside cancellation coexist.  Python 3.9 and 3.10 have no ``uncancel()``;
there the scopes keep an equivalent per-task count of their own cancel
requests (see ``_cancel_task``).
"""

from __future__ import annotations

import asyncio
import builtins
import inspect
import math
import operator
import sys
import types
import weakref
from collections.abc import Awaitable
from datetime import timedelta
from typing import Any, SupportsFloat, SupportsIndex, TypeVar, Union, overload

from ._default import default_timer
from ._hwtimer import (
    HashedWheelTimer,
    TimeoutScope,
    _follow_loop_time,
    _ManualTimer,
    _setup_scopes,
)

__all__ = ["TimeoutScope", "sleep", "timeout", "timeout_at", "wait_for"]

_T = TypeVar("_T")
Seconds = Union[float, SupportsFloat, SupportsIndex, timedelta]

if sys.version_info >= (3, 11):
    _TimeoutError: type[Exception] = builtins.TimeoutError
else:

    class _TimeoutError(asyncio.TimeoutError, builtins.TimeoutError):
        """Raised on expiry before 3.11, where asyncio.TimeoutError and the
        builtin TimeoutError are distinct: either ``except`` clause catches it.
        """

    _TimeoutError.__name__ = _TimeoutError.__qualname__ = "TimeoutError"
    # Where pickle looks the class up, by its module and name: raised in a
    # process of multiprocessing or a ProcessPoolExecutor, it reaches the
    # caller as the builtin TimeoutError of 3.11+ does.
    TimeoutError = _TimeoutError

_BaseExceptionGroup: type[BaseException] | None = getattr(builtins, "BaseExceptionGroup", None)


def _seconds(delay: Seconds, name: str = "delay") -> float:
    """Returns `delay` in seconds (a timedelta is converted), a number that
    compares with 0: what has ``__float__`` as its float, or else
    ``__index__`` as its int, as ``new_timeout()`` reads them.  An int past
    any float is infinite, as for ``new_timeout()``: never due, or at once.
    Anything else, a bool too (``timeout(True)`` would otherwise be a
    second), is refused with the TypeError ``new_timeout()`` gives, naming
    the argument `name`."""
    if isinstance(delay, float):
        return delay
    if isinstance(delay, int):
        seconds = delay
    elif isinstance(delay, timedelta):
        # what it holds, whatever a subclass's own methods say
        return timedelta.total_seconds(delay)
    elif isinstance(delay, SupportsFloat):
        try:
            return float(delay)
        except OverflowError as exc:
            # past any float (a huge Fraction): infinite, as new_timeout()
            # reads it, if it compares with 0
            try:
                if delay > 0:  # type: ignore[operator]
                    return math.inf
                if delay < 0:  # type: ignore[operator]
                    return -math.inf
            except Exception:
                pass
            raise exc from None
    elif isinstance(delay, SupportsIndex):
        seconds = operator.index(delay)
    else:
        raise TypeError(
            f"{name} must be a number of seconds or a timedelta, not {type(delay).__name__}"
        )
    if type(seconds) is bool:  # also what an __index__ returned
        raise TypeError(f"{name} must be a number of seconds or a timedelta, not bool")
    if abs(seconds) > sys.float_info.max:
        return math.inf if seconds > 0 else -math.inf
    return seconds


def _check_timer(timer: object) -> None:
    """Refuses what is no timer, whatever the delay: also where no deadline
    is needed (a delay <= 0), which would otherwise let it through."""
    if timer is not None and not isinstance(timer, HashedWheelTimer):
        raise TypeError(f"timer must be a HashedWheelTimer or None, not {type(timer).__name__}")


if sys.version_info >= (3, 11):
    # Tasks count cancel requests themselves: TimeoutScope calls their
    # cancelling() and cancel() directly.
    _cancelling_hook = _cancel_hook = None

    def _uncancel_task(task: asyncio.Task[Any]) -> int:
        """Withdraws one cancel request; returns the count left."""
        return task.uncancel()

    def _cancelled_by_no_scope(exc: BaseException | None, handled: BaseException | None) -> bool:
        """The count tells it all: Task.cancel() counts every request."""
        return False

else:
    # Task.cancel() does not count its requests before 3.11.  The scopes
    # count theirs here, per task, standing in for Task.cancelling().  An
    # entry goes when its count drops to zero, and the dictionary is weak,
    # so that a task that swallowed a cancellation does not stay alive.
    _cancel_requests: weakref.WeakKeyDictionary[asyncio.Task[Any], int] = (
        weakref.WeakKeyDictionary()
    )

    def _cancel_pending(task: asyncio.Task[Any]) -> bool:
        """Returns whether `task` has a cancellation on its way that its
        coroutine has not yet seen (3.9/3.10 tasks expose both fields).

        Task.cancel() leaves no mark on the task itself when what it awaits
        takes the cancellation: a future is cancelled at once, but a task
        (or a gather()) it awaits may take many iterations to finish
        cancelling, and only that task, or the gather, shows the request.
        So the chain of awaited tasks is followed down.  A task down there
        whose own scopes asked for its cancellation is not followed: that
        cancellation is its own."""
        for _ in range(64):  # a chain of tasks awaiting each other ends
            if getattr(task, "_must_cancel", False):
                return True
            waiter = getattr(task, "_fut_waiter", None)
            if waiter is None or waiter.done():
                return waiter is not None and waiter.cancelled()
            if getattr(waiter, "_cancel_requested", False):  # a gather()
                return True
            if not isinstance(waiter, asyncio.Task) or _cancel_requests.get(waiter, 0):
                return False
            task = waiter
        return False

    def _cancelling(task: asyncio.Task[Any]) -> int:
        """Returns the task's count of pending cancel requests."""
        count = _cancel_requests.get(task, 0)
        if count == 0 and _cancel_pending(task):
            # Someone else asked for this cancellation: it counts, as it
            # does on 3.11+.  Only while it is on its way: not kept, as
            # these versions have no uncancel() with which a task that
            # swallows it could take it back.
            count = 1
        return count

    def _cancel_task(task: asyncio.Task[Any]) -> None:
        """Cancels `task` on behalf of an expired scope, counting the
        request.  A cancel already pending that no scope asked for came from
        outside and counts as one more request, so that it wins over the
        timeout.  An outside cancel() made after this one, before the task
        runs again, cannot be seen on these versions (their own wait_for()
        has the same blind spot)."""
        count = _cancel_requests.get(task, 0)
        if count == 0 and _cancel_pending(task):
            count = 1
        _cancel_requests[task] = count + 1
        task.cancel(msg=_DEADLINE_PASSED)  # as gather() passes it

    def _cancelled_by_no_scope(exc: BaseException | None, handled: BaseException | None) -> bool:
        """Returns whether the CancelledError `exc` comes from a cancel()
        that no scope made, which the count cannot see on these versions:
        one that a task the body awaits was handling when the scope's
        cancellation came.  A scope's cancellation carries its message,
        also when a task or gather() it went through raises a
        CancelledError of its own (with the one it took as its context).
        `handled` is the exception the task was handling when it entered
        the scope: it, and the chain it leads on to, came before the
        scope's cancel() and are no later request."""
        while exc is not None and exc is not handled:
            if _is_the_scopes(exc):
                break
            exc = exc.__context__
        else:
            # No trace of the scope's message: still the scope's, as code
            # that took its cancellation may raise a CancelledError afresh
            # (asyncio.Condition.wait() does, cancelled while it takes its
            # lock back); a cancel() that came after the body swallowed
            # the scope's looks the same, and is not told apart.
            return False
        # The scope's cancellation came while a task in between was
        # handling another one: a cancel() made before the deadline passed,
        # by then out of sight (that task had taken it).
        exc = exc.__context__
        while exc is not None and exc is not handled:
            if isinstance(exc, asyncio.CancelledError) and not _is_the_scopes(exc):
                return True
            exc = exc.__context__
        return False

    def _is_the_scopes(exc: BaseException) -> bool:
        """Whether `exc` carries the message of a scope's cancel()."""
        return bool(exc.args) and exc.args[0] is _DEADLINE_PASSED

    def _uncancel_task(task: asyncio.Task[Any]) -> int:
        """Withdraws one request made by _cancel_task; returns the count left."""
        count = _cancel_requests.get(task, 0)
        if count <= 1:
            _cancel_requests.pop(task, None)
            return 0
        _cancel_requests[task] = count - 1
        return count - 1

    _cancelling_hook, _cancel_hook = _cancelling, _cancel_task

    class _DeadlineMessage(str):
        """The message of a scope's cancel(): the one object tells the
        scopes' cancellations from others'."""

    _DEADLINE_PASSED = _DeadlineMessage("the deadline of a timeout scope passed")


def _insert_timeout_error(exc: BaseException) -> None:
    """Puts a TimeoutError between `exc` and the CancelledError in its
    context chain, so that a traceback tells the cancellation came from a
    timeout (Python 3.13 does the same)."""
    while exc.__context__ is not None:
        if isinstance(exc.__context__, asyncio.CancelledError):
            timeout_error = _TimeoutError()
            timeout_error.__context__ = timeout_error.__cause__ = exc.__context__
            exc.__context__ = timeout_error
            return
        exc = exc.__context__


def _exit_expired(
    task: asyncio.Task[Any],
    cancelling: int,
    exc_type: type[BaseException] | None,
    exc_val: BaseException | None,
    handled: BaseException | None = None,
) -> None:
    """Leaves a scope whose deadline cancelled its task.

    Withdraws the scope's cancel request.  Only when no other request is left
    (an outer scope's, or a cancel() from outside) is the cancellation this
    scope's to turn into ``TimeoutError``.  `handled` is the exception the
    task was handling when it entered the scope (before 3.11; else None).
    """
    if _uncancel_task(task) <= cancelling and exc_type is not None:
        if issubclass(exc_type, asyncio.CancelledError):
            if _cancelled_by_no_scope(exc_val, handled):
                return  # someone else's cancellation: it goes on
            raise _TimeoutError from exc_val
        if exc_val is not None:
            _insert_timeout_error(exc_val)
            if _BaseExceptionGroup is not None and isinstance(exc_val, _BaseExceptionGroup):
                for exc in exc_val.exceptions:  # type: ignore[attr-defined]
                    _insert_timeout_error(exc)


# TimeoutScope is C (hwtimer._hwtimer): entering and leaving a scope whose
# deadline does not pass is every request's cost.  It calls back here for
# what differs between versions and for the exit of an expired scope.
_setup_scopes(default_timer, asyncio.current_task, _cancelling_hook, _cancel_hook, _exit_expired)


def timeout(delay: Seconds | None, *, timer: HashedWheelTimer | None = None) -> TimeoutScope:
    """Returns an async context manager that cancels its block after `delay`
    seconds and raises ``TimeoutError`` out of it; None means no deadline.

    Like ``asyncio.timeout()``, on `timer` (default: ``default_timer()``).
    Must be called with a running event loop.
    """
    if delay is None:
        asyncio.get_running_loop()  # the same RuntimeError without one
        return TimeoutScope(None, timer=timer)
    return TimeoutScope._after(_seconds(delay), timer)


def timeout_at(when: float | None, *, timer: HashedWheelTimer | None = None) -> TimeoutScope:
    """Like ``timeout()``, with an absolute deadline on ``loop.time()``."""
    return TimeoutScope(when, timer=timer)


_timeout_scope = timeout  # wait_for() has a parameter named timeout


async def _cancel_and_wait(fut: asyncio.Future[Any]) -> None:
    """Cancels `fut` and returns once it is done.  Waits on a future of its
    own rather than on `fut`, so that the caller can itself be cancelled
    while `fut` is still finishing."""
    waiter = asyncio.get_running_loop().create_future()

    def release(_: object) -> None:
        if not waiter.done():
            waiter.set_result(None)

    fut.add_done_callback(release)
    try:
        fut.cancel()
        await waiter
    finally:
        fut.remove_done_callback(release)


# What wait_for() is mostly given, awaitable without inspect's checks (the
# last of which, an ABC's isinstance(), is the slow one).
_AWAITABLE_TYPES = frozenset({types.CoroutineType, asyncio.Future, asyncio.Task})


def _check_awaitable(aw: object) -> None:
    """Refuses, before wait_for() schedules its deadline, what it could not
    await: a refusal later would count a schedule and a cancel in the
    timer's stats() for nothing.  A function of its own, so that nothing it
    looks up (a future's bound get_loop) stays in wait_for()'s frame for
    as long as the wait."""
    if type(aw) not in _AWAITABLE_TYPES and not inspect.isawaitable(aw):
        raise TypeError(f"object {type(aw).__name__} can't be used in 'await' expression")
    if asyncio.isfuture(aw):
        get_loop = getattr(aw, "get_loop", None)
        if get_loop is not None and get_loop() is not asyncio.get_running_loop():
            # Awaited, it would fail only after its deadline was scheduled;
            # and with no time left, cancelling it would wait for ever on
            # the loop it belongs to.  asyncio.wait_for() of 3.11 refuses it
            # so.
            raise ValueError("The future belongs to a different loop than the running one")


async def wait_for(
    aw: Awaitable[_T],
    timeout: Seconds | None,
    *,
    timer: HashedWheelTimer | None = None,
) -> _T:
    """Returns the result of `aw`, or cancels it and raises ``TimeoutError``
    once `timeout` seconds have passed.  Like ``asyncio.wait_for()`` of
    Python 3.12 and later, with the deadline on `timer`.
    """
    _check_awaitable(aw)
    started = False  # whether anything but this function holds `aw`
    try:
        _check_timer(timer)
        if timeout is not None:
            timeout = _seconds(timeout, "timeout")
            if math.isnan(timeout):  # which the scope would refuse as its delay
                raise ValueError("timeout must not be NaN")
            if timeout <= 0:
                # No time at all: the awaitable never runs, unless it is a
                # future that is done already.
                fut = asyncio.ensure_future(aw)
                started = True
                if fut.done():
                    return fut.result()
                await _cancel_and_wait(fut)
                try:
                    return fut.result()
                except asyncio.CancelledError as exc:
                    raise _TimeoutError from exc
        async with _timeout_scope(timeout, timer=timer):
            started = True
            return await aw
    except BaseException:
        if not started:
            # Refused (a stopped or full timer, a bad argument): a coroutine
            # handed over is closed, as TaskGroup.create_task() closes one,
            # rather than left to warn that it was never awaited.
            _close_coroutine(aw)
        raise


def _close_coroutine(aw: object) -> None:
    if isinstance(aw, types.CoroutineType):
        aw.close()


def _set_result_unless_done(fut: asyncio.Future[Any], result: Any) -> None:
    if not fut.done():
        fut.set_result(result)


@overload
async def sleep(delay: Seconds, *, timer: HashedWheelTimer | None = ...) -> None: ...
@overload
async def sleep(delay: Seconds, result: _T, *, timer: HashedWheelTimer | None = ...) -> _T: ...
async def sleep(
    delay: Seconds, result: Any = None, *, timer: HashedWheelTimer | None = None
) -> Any:
    """Returns `result` after `delay` seconds, like ``asyncio.sleep()``, with
    the deadline on `timer`.  A delay <= 0 yields to the loop once."""
    _check_timer(timer)
    delay = _seconds(delay)
    if delay <= 0:
        await asyncio.sleep(0)
        return result
    if math.isnan(delay):
        raise ValueError("Invalid delay: NaN (not a number)")
    if timer is None:
        timer = default_timer()
    if _follow_loop_time(None) and not isinstance(timer, _ManualTimer):
        # hwtimer.testing.follow_loop_time(): the loop's clock rules
        return await asyncio.sleep(delay, result)
    loop = asyncio.get_running_loop()
    fut = loop.create_future()
    moved: asyncio.TimerHandle | None = None

    def on_stop(remaining: float) -> None:
        # The timer stopped before the deadline (called in this loop's
        # thread): the sleep goes on on the loop's clock, `remaining`
        # seconds on from now, as asyncio.sleep() would have.
        nonlocal moved
        if not fut.done() and remaining != math.inf:
            moved = loop.call_later(remaining, _set_result_unless_done, fut, result)

    handle = timer._call_later_on_stop(on_stop, delay, _set_result_unless_done, fut, result)
    try:
        return await fut
    finally:
        handle.cancel()
        if moved is not None:
            moved.cancel()
