"""The shape of HashedWheelTimer.stats(), for type checkers and readers."""

from typing import TypedDict


class Stats(TypedDict):
    """What ``timer.stats()`` returns: counts since the timer was made,
    lateness over the last 4096 tasks, times in seconds."""

    pending: int
    scheduled: int
    expired: int
    cancelled: int
    rejected: int
    task_errors: int
    ticks: int
    wakeups: int
    max_expired_per_tick: int
    late_p50: float
    late_p99: float
    late_max: float
    late_samples: int
    task_time_max: float
