"""hwtimer: Netty's HashedWheelTimer for Python, with a C core.

One timer, one wheel, one native worker thread serves a whole process:
schedule and cancel are O(1) and safe from any thread, expired tasks run
under the GIL on the timer's dispatch thread (or an executor, or an asyncio
event loop), never on the ticking thread.
"""

from ._hwtimer import HashedWheelTimer, RejectedExecutionError, Timeout
from ._default import default_timer

__all__ = [
    "HashedWheelTimer",
    "RejectedExecutionError",
    "Timeout",
    "default_timer",
]
