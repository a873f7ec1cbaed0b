"""The shape of HashedWheelTimer.stats(), for type checkers and readers."""

from typing import TypedDict


class LevelStats(TypedDict):
    """One level of the wheel in ``stats()["levels"]``: level 0 is the wheel
    the timer was made with, each level above it 64 buckets, each as wide
    as the whole level below."""

    bucket_seconds: float  # the time one bucket spans
    buckets: int
    occupied: int  # buckets holding at least one timeout
    timeouts: int  # pending timeouts held (a cancelled one leaves when cancel() returns)
    fullest: int  # timeouts in the fullest bucket


class Stats(TypedDict):
    """What ``timer.stats()`` returns: counts since the timer was made,
    lateness over the last 4096 timed tasks, times in seconds."""

    pending: int
    scheduled: int
    expired: int
    cancelled: int
    taken_back: int  # call_later() callbacks taken back from their loop unrun: out of expired
    rejected: int
    task_errors: int
    ticks: int
    wakeups: int
    max_expired_per_tick: int
    late_p50: float
    late_p99: float
    late_max: float
    late_samples: int
    untimed_tasks: int
    task_time_max: float
    levels: list[LevelStats]
    fullest_bucket: int
    never_due: int
