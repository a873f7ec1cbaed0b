"""hwtimer: Netty's HashedWheelTimer for Python, with a C core.

One timer, one wheel, one native worker thread serves a whole process:
schedule and cancel are O(1) and safe from any thread, expired tasks run
under the GIL on the timer's dispatch thread (or an executor, or an asyncio
event loop), never on the ticking thread.
"""

import pkgutil

# The one place the version is written: setuptools reads it for the
# distribution's metadata (pyproject.toml's dynamic version).
__version__ = "0.1.0"

# Run from a source checkout after ``pip install .`` (``python -m hwtimer``
# puts the checkout first on sys.path), this package has no compiled
# extension beside it: look for the rest of the package, the extension
# included, in the installed copy too.
__path__ = pkgutil.extend_path(__path__, __name__)

from ._asyncio import TimeoutScope, sleep, timeout, timeout_at, wait_for  # noqa: E402
from ._default import default_timer  # noqa: E402
from ._hwtimer import HashedWheelTimer, RejectedExecutionError, Timeout  # noqa: E402
from ._stats import LevelStats, Stats  # noqa: E402

__all__ = [
    "HashedWheelTimer",
    "LevelStats",
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
