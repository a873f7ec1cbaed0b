"""hwtimer: Netty's HashedWheelTimer for Python, with a C core.

One timer, one wheel, one native worker thread serves a whole process:
schedule and cancel are O(1) and safe from any thread, expired tasks run
under the GIL on the timer's dispatch thread (or an executor, or an asyncio
event loop), never on the ticking thread.
"""

from ._asyncio import TimeoutScope, sleep, timeout, timeout_at, wait_for
from ._default import default_timer
from ._hwtimer import HashedWheelTimer, RejectedExecutionError, Timeout
from ._stats import Stats

__all__ = [
    "HashedWheelTimer",
    "RejectedExecutionError",
    "Stats",
    "Timeout",
    "TimeoutScope",
    "default_timer",
    "sleep",
    "timeout",
    "timeout_at",
    "wait_for",
]
