"""What re-arming costs: Timeout.reset() and periodic timeouts.

1. Moving a pending timeout's deadline, with 1,000 and 1,000,000 others
   pending on the same timer: ``Timeout.reset()`` against the cancel +
   ``new_timeout()`` it replaces (ns per re-arm).
2. The same in an asyncio loop: ``reset()`` of a ``timer.call_later()``
   handle against asyncio's ``Timeout.reschedule()`` (3.11+) and a
   ``TimerHandle`` cancelled and replaced by ``loop.call_later()``, with
   1,000 other handles pending on each.
3. A periodic task's cost per run: ``new_periodic()`` against a task that
   re-arms itself with ``new_timeout()`` each time (process CPU time per
   run, worker and dispatch threads included).

Wall time is ``time.perf_counter_ns``; CPU time ``time.process_time_ns``.
Each figure is the median of several repeats, the cases of one table
interleaved in a rotating order so that the machine's load hits them all
alike.

    python benchmarks/rearm.py
    python benchmarks/rearm.py --repeat 9 --json results.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import random
import statistics
import sys
import time
from typing import Any, Callable

import hwtimer

FAR = (60.0, 600.0)  # seconds: deadlines never reached during a run
OPS = 20_000  # re-arms per measurement


def noop(*args: object) -> None:
    pass


def interleaved(cases: dict[str, Callable[[], float]], repeat: int) -> dict[str, float]:
    """Runs every case `repeat` times in a rotating order; each call
    returns ns per operation.  Returns the medians."""
    names = list(cases)
    got: dict[str, list[float]] = {k: [] for k in names}
    for r in range(repeat):
        for k in names[r % len(names) :] + names[: r % len(names)]:
            got[k].append(cases[k]())
    return {k: statistics.median(v) for k, v in got.items()}


def far_delays(n: int, seed: int = 1) -> list[float]:
    rng = random.Random(seed)
    return [rng.uniform(*FAR) for _ in range(n)]


# ---- 1. reset against cancel + new_timeout ----


def rearm_cases(pending: int) -> tuple[dict[str, Callable[[], float]], Callable[[], None]]:
    timer = hwtimer.HashedWheelTimer(0.1, 512)
    background = [timer.new_timeout(noop, d) for d in far_delays(pending)]
    delays = far_delays(OPS, seed=2)
    handles = [timer.new_timeout(noop, d) for d in far_delays(1000, seed=3)]

    def reset() -> float:
        hs = handles
        t0 = time.perf_counter_ns()
        for i, d in enumerate(delays):
            hs[i % 1000].reset(d)
        return (time.perf_counter_ns() - t0) / len(delays)

    def cancel_new() -> float:
        hs, new = handles, timer.new_timeout
        t0 = time.perf_counter_ns()
        for i, d in enumerate(delays):
            j = i % 1000
            hs[j].cancel()
            hs[j] = new(noop, d)
        return (time.perf_counter_ns() - t0) / len(delays)

    def close() -> None:
        background.clear()
        timer.stop()

    return {"reset()": reset, "cancel() + new_timeout()": cancel_new}, close


# ---- 2. in an asyncio loop ----


def in_loop(loop: asyncio.AbstractEventLoop, chunk: Callable[[int], float]) -> Callable[[], float]:
    """A case that runs chunk(start) (1,000 re-arms from `start`, returning
    their ns) inside the running loop, yielding to it between chunks, so
    that asyncio purges its cancelled handles as a live service's does."""

    async def timed() -> float:
        total = 0.0
        for start in range(0, OPS, 1000):
            total += chunk(start)
            await asyncio.sleep(0)
        return total / OPS

    return lambda: loop.run_until_complete(timed())


def loop_cases(loop: asyncio.AbstractEventLoop) -> tuple[dict[str, Callable[[], float]], Any]:
    timer = hwtimer.HashedWheelTimer(0.1, 512)
    delays = far_delays(OPS, seed=4)
    keep = [loop.call_later(d, noop) for d in far_delays(1000, seed=5)]
    keep += [timer.call_later(d, noop, loop=loop) for d in far_delays(1000, seed=6)]
    hw = [timer.call_later(d, noop, loop=loop) for d in far_delays(1000, seed=7)]
    th = [loop.call_later(d, noop) for d in far_delays(1000, seed=8)]

    def hw_reset(start: int) -> float:
        t0 = time.perf_counter_ns()
        for j, d in enumerate(delays[start : start + 1000]):
            hw[j].reset(d)
        return time.perf_counter_ns() - t0

    def handle_replace(start: int) -> float:
        call_later = loop.call_later
        t0 = time.perf_counter_ns()
        for j, d in enumerate(delays[start : start + 1000]):
            th[j].cancel()
            th[j] = call_later(d, noop)
        return time.perf_counter_ns() - t0

    cases = {
        "hwtimer call_later + reset()": in_loop(loop, hw_reset),
        "asyncio TimerHandle cancel() + call_later()": in_loop(loop, handle_replace),
    }
    if sys.version_info >= (3, 11):

        async def enter() -> list[asyncio.Timeout]:
            cms = [asyncio.timeout(None) for _ in range(1000)]
            for cm in cms:
                await cm.__aenter__()
            return cms

        # entered in one task; reschedule() does not ask which task calls it
        cms = loop.run_until_complete(enter())

        def scope_reschedule(start: int) -> float:
            now = loop.time()
            t0 = time.perf_counter_ns()
            for j, d in enumerate(delays[start : start + 1000]):
                cms[j].reschedule(now + d)
            return time.perf_counter_ns() - t0

        cases["asyncio Timeout.reschedule()"] = in_loop(loop, scope_reschedule)
    return cases, (timer, keep)


# ---- 3. periodic runs ----


def periodic_run_cost(kind: str, n: int, period: float, seconds: float) -> float:
    """CPU ns per run of `n` tasks repeating every `period` for `seconds`."""
    timer = hwtimer.HashedWheelTimer(0.001, 1024)
    runs = [0]
    try:
        if kind == "periodic":

            def task(to: hwtimer.Timeout) -> None:
                runs[0] += 1

            for _ in range(n):
                timer.new_periodic(task, period)
        else:
            new = timer.new_timeout

            def again(to: hwtimer.Timeout) -> None:
                runs[0] += 1
                new(again, period)

            for _ in range(n):
                timer.new_timeout(again, period)
        c0 = time.process_time_ns()
        time.sleep(seconds)
        cpu = time.process_time_ns() - c0
        done = runs[0]
    finally:
        timer.stop()
    return cpu / max(done, 1)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5, help="repeats per figure (median)")
    parser.add_argument("--pending", type=int, nargs="+", default=[1_000, 1_000_000])
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args(argv)
    out: dict[str, Any] = {
        "python": platform.python_version(),
        "machine": platform.machine(),
        "repeat": args.repeat,
    }

    print(f"Python {platform.python_version()}, median of {args.repeat} interleaved repeats")
    for pending in args.pending:
        cases, close = rearm_cases(pending)
        try:
            res = interleaved(cases, args.repeat)
        finally:
            close()
        out[f"rearm_ns_{pending}_pending"] = res
        print(f"\nre-arm with {pending:,} pending (ns per re-arm)")
        for k, v in res.items():
            print(f"  {k:45s} {v:8.0f}")

    loop = asyncio.new_event_loop()
    try:
        cases, keep = loop_cases(loop)
        res = interleaved(cases, args.repeat)
        keep[0].stop()
    finally:
        loop.close()
    out["loop_rearm_ns"] = res
    print("\nre-arm in an asyncio loop, 1,000 pending (ns per re-arm)")
    for k, v in res.items():
        print(f"  {k:45s} {v:8.0f}")

    res = interleaved(
        {
            "new_periodic()": lambda: periodic_run_cost("periodic", 1000, 0.01, 1.0),
            "task re-arming itself with new_timeout()": lambda: periodic_run_cost(
                "self", 1000, 0.01, 1.0
            ),
        },
        args.repeat,
    )
    out["periodic_cpu_ns_per_run"] = res
    print("\nperiodic tasks: 1,000 every 10 ms for 1 s (CPU ns per run)")
    for k, v in res.items():
        print(f"  {k:45s} {v:8.0f}")

    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
