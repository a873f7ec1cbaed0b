"""python -m hwtimer: a first look at what the timer does, in a few seconds.

Schedules a few hundred thousand request-style timeouts, cancels most of
them (as a service does when requests answer in time), lets the rest fire,
and prints the counts, how late the tasks ran against the tick, what was
pending once they were scheduled (the soonest timeouts and how they spread
over the wheel), and what a schedule+cancel costs next to asyncio's
call_later+cancel on a running event loop, measured here.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import random
import sys
import threading
import time

from ._hwtimer import HashedWheelTimer, Timeout, _backend
from ._stats import Stats

# How many schedule+cancel pairs asyncio's loop takes between two turns.
_TURN_EVERY = 10_000


def _pair_cost_hwtimer(timer: HashedWheelTimer, n: int) -> float:
    """Returns ns per new_timeout + cancel, most never firing."""

    def task(_timeout: object) -> None:
        pass

    delays = [random.uniform(1.0, 60.0) for _ in range(n)]
    new_timeout = timer.new_timeout
    start = time.perf_counter_ns()
    for d in delays:
        new_timeout(task, d).cancel()
    return (time.perf_counter_ns() - start) / n


def _pair_cost_asyncio(n: int) -> float:
    """Returns ns per loop.call_later + cancel on a fresh event loop.  The
    loop turns every _TURN_EVERY pairs, as a live service's does, and so
    drops its cancelled handles: on a loop that never ran they would pile up
    in its heap, and the figure would be one no service sees.  For the same
    reason it runs out of debug mode, which PYTHONASYNCIODEBUG=1 or -X dev
    would give it, and in which each call_later() records a traceback."""

    def callback() -> None:
        pass

    async def pairs() -> None:
        call_later = loop.call_later
        for start in range(0, n, _TURN_EVERY):
            for d in delays[start : start + _TURN_EVERY]:
                call_later(d, callback).cancel()
            await asyncio.sleep(0)

    delays = [random.uniform(1.0, 60.0) for _ in range(n)]
    loop = asyncio.new_event_loop()
    loop.set_debug(False)
    try:
        start = time.perf_counter_ns()
        loop.run_until_complete(pairs())
        return (time.perf_counter_ns() - start) / n
    finally:
        loop.close()


def _spread(stats: Stats) -> str:
    """The wheel's spread in one line: its levels that hold timeouts."""
    levels = [
        f"level {i} ({lv['bucket_seconds']:g} s buckets): {lv['timeouts']:,} timeouts"
        f" in {lv['occupied']:,} of {lv['buckets']:,} buckets, fullest {lv['fullest']:,}"
        for i, lv in enumerate(stats["levels"])
        if lv["timeouts"]
    ]
    return "; ".join(levels) or "the wheel is empty"


def _wait_settled(timer: HashedWheelTimer, limit: float) -> None:
    """Returns once `timer` counts no timeout pending, or after `limit`
    seconds: with nothing left to fire, the counts the report prints are
    then settled (scheduled == expired + cancelled).  A cancel counts when
    it returns, so this is at once, whatever the tick: waiting a tick or
    two for the worker would be minutes with a long tick."""
    deadline = time.monotonic() + limit
    while timer.pending_timeouts() and time.monotonic() < deadline:
        time.sleep(0.001)


#: How long the report waits, at most, for the timeouts left to fire: a
#: tick of minutes would otherwise keep it waiting for that long.
_FIRE_WAIT = 30.0


def _percentile(sorted_values: list[float], q: float) -> float:
    return sorted_values[min(len(sorted_values) - 1, int(q * (len(sorted_values) - 1)))]


def main(argv: list[str] | None = None) -> int:
    # no description under python -OO, which strips the docstring
    description = __doc__.split("\n")[0] if __doc__ else None
    parser = argparse.ArgumentParser(
        prog="python -m hwtimer",
        description=description,
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("-n", type=int, default=300_000, help="timeouts to schedule")
    parser.add_argument("--fire", type=float, default=0.05, help="share of them left to fire")
    parser.add_argument("--tick", type=float, default=0.01, help="tick_duration in seconds")
    args = parser.parse_args(argv)
    if args.n <= 0 or not 0.0 <= args.fire <= 1.0 or not 0 < args.tick < math.inf:
        parser.error("-n must be > 0, --fire in [0, 1], --tick a number of seconds > 0")
    try:
        timer = HashedWheelTimer(args.tick, 512, thread_name="hwtimer-demo")
    except ValueError as e:
        parser.error(f"--tick {args.tick:g}: {e}")
    tick = timer.tick_duration  # a tick below the finest is clamped (with a warning)

    print(f"hwtimer on CPython {sys.version.split()[0]}, {_backend} backend")
    lateness: list[float] = []
    lock = threading.Lock()
    done = threading.Event()
    n_fire = int(args.n * args.fire)

    def task(timeout: object) -> None:
        late = time.monotonic() - timeout.deadline  # type: ignore[attr-defined]
        with lock:
            lateness.append(late)
            if len(lateness) == n_fire:
                done.set()

    with timer:
        # Request timeouts: all due within a second, most cancelled at once.
        start = time.perf_counter()
        fire = set(random.sample(range(args.n), n_fire))
        for i in range(args.n):
            t = timer.new_timeout(task, random.uniform(0.1, 1.0))
            if i not in fire:
                t.cancel()
        scheduled_in = time.perf_counter() - start
        # What an operator would see now: the soonest, and where they wait.
        snap_start = time.perf_counter_ns()
        soonest: list[Timeout] = timer.pending_snapshot(5)
        snap_ns = time.perf_counter_ns() - snap_start
        then = time.monotonic()
        pending_stats = timer.stats()
        gave_up = False
        if n_fire:
            gave_up = not done.wait(_FIRE_WAIT)
        else:
            _wait_settled(timer, 5.0)
        stats = timer.stats()

        pairs = min(args.n, 200_000)
        ns_hw = _pair_cost_hwtimer(timer, pairs)
    ns_aio = _pair_cost_asyncio(pairs)

    lateness.sort()
    if gave_up:
        print(
            f"stopped waiting after {_FIRE_WAIT:g} s for the timeouts left to fire "
            f"(tick {tick:g} s): {n_fire - len(lateness):,} of {n_fire:,} had not "
            f"fired, and stop() cancelled them"
        )
    print(
        f"scheduled {stats['scheduled']:,} timeouts in {scheduled_in:.2f} s, "
        f"cancelled {stats['cancelled']:,}, fired {stats['expired']:,}, "
        f"pending {stats['pending']:,}"
    )
    if lateness:
        print(
            f"lateness (task start - deadline), tick {tick * 1e3:g} ms: "
            f"p50 {_percentile(lateness, 0.5) * 1e3:.2f} ms, "
            f"p99 {_percentile(lateness, 0.99) * 1e3:.2f} ms, "
            f"max {lateness[-1] * 1e3:.2f} ms, "
            f"early {sum(1 for x in lateness if x < 0)}"
        )
    print(
        f"most timeouts expired in one tick: {stats['max_expired_per_tick']:,}; "
        f"worker wake-ups: {stats['wakeups']:,}"
    )
    print(
        f"pending once scheduled: {pending_stats['pending']:,}; the soonest "
        f"{len(soonest)} due in "
        + (", ".join(f"{t.deadline - then:.3f}" for t in soonest) or "-")
        + f" s (pending_snapshot took {snap_ns / 1e3:.0f} us)"
    )
    print(
        f"fullest bucket then: {pending_stats['fullest_bucket']:,} timeouts due in one tick; "
        + _spread(pending_stats)
    )
    print(
        f"schedule+cancel: hwtimer {ns_hw:.0f} ns, asyncio call_later+cancel {ns_aio:.0f} ns "
        f"({ns_aio / ns_hw:.1f}x)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
