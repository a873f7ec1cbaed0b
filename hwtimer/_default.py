"""The process-wide shared timer behind default_timer()."""

from __future__ import annotations

import os
import threading

from ._hwtimer import HashedWheelTimer, _mark_shared

#: Tick of the shared timer: asyncio's own timers are good to about a
#: millisecond, and an idle timer does not wake at all, so a fine tick costs
#: little.  4096 buckets make one turn of the wheel 4.096 s.
DEFAULT_TICK = 0.001
DEFAULT_TICKS_PER_WHEEL = 4096

#: Reentrant: a signal handler (or a finalizer) that runs in this thread
#: while it makes the shared timer, and asks for it too, must not wait for
#: the lock this thread holds.
_lock = threading.RLock()
_timer: HashedWheelTimer | None = None

#: In a child of fork() made by a task of the shared timer: the parent's
#: shared timer, which could not be stopped there, kept from collection.
_unstoppable: list[HashedWheelTimer] = []


class _Installed:
    """A timer installed by one hwtimer.testing.use_timer() block.  Equal
    only to itself: the block removes its own installation, not another of
    the same timer."""

    __slots__ = ("timer",)

    def __init__(self, timer: HashedWheelTimer) -> None:
        self.timer = timer


#: The installations of hwtimer.testing.use_timer(), innermost last; the
#: same for every thread.
_installed: list[_Installed] = []


def default_timer() -> HashedWheelTimer:
    """Returns the process-wide shared timer, created on first use.

    It is never stopped by hwtimer except at interpreter exit; a child of
    fork() gets a timer of its own on first use.  Inside
    ``hwtimer.testing.use_timer(timer)`` it returns that timer instead.
    """
    if _installed:
        try:
            return _installed[-1].timer
        except IndexError:  # the last one was removed meanwhile
            pass
    return _shared()


def _shared() -> HashedWheelTimer:
    """The process's shared timer, whatever use_timer() installed: made on
    first use, and in a child of fork() anew."""
    global _timer
    timer = _timer
    if timer is None:
        with _lock:
            timer = _timer
            if timer is None:
                made = HashedWheelTimer(
                    DEFAULT_TICK, DEFAULT_TICKS_PER_WHEEL, thread_name="hwtimer-default"
                )
                _mark_shared(made)
                # A handler that ran in here meanwhile may have made it
                # already: that one is the process's (checked and set with
                # no call in between, where another could run).
                if _timer is None:
                    _timer = made
                timer = _timer
    return timer


def _forget_in_child() -> None:
    # The parent's worker did not come along: the child makes its own timer.
    # The parent's is stopped here, as the child can never run it: dropped
    # as it was, it would be collected unstopped, with the ResourceWarning
    # meant for a timer that a user forgot to stop.
    global _timer, _lock
    timer, _timer = _timer, None
    _lock = threading.RLock()
    if timer is not None:
        try:
            timer.stop()
        except RuntimeError:
            # Forked by one of its own tasks, which goes on in the child:
            # stop() cannot be called from there, and the timer cannot run
            # here either.  Kept, it is never collected unstopped.
            _unstoppable.append(timer)


os.register_at_fork(after_in_child=_forget_in_child)
