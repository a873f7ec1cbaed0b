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
Each table runs in a fresh interpreter, its cases interleaved in a rotating
order for several repeats so that the machine's load hits them all alike;
each figure is the median of the repeats with their min-max beside it.

    python benchmarks/rearm.py
    python benchmarks/rearm.py --repeat 9 --json results.json

``benchmarks/run.py --module rearm`` runs it with the other benchmarks
(``--size quick`` and ``tiny`` use fewer pending timeouts and re-arms).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import random
import sys
import time
from typing import Any, Callable

from common import fmt, per_round, run_child, summary

# pending: the levels of table 1; ops: re-arms per measurement; periodic:
# tasks, their period and the seconds each measurement lasts
SIZES = {
    "full": {"pending": [1_000, 1_000_000], "ops": 20_000, "periodic": [1000, 0.01, 1.0]},
    "quick": {"pending": [1_000, 100_000], "ops": 20_000, "periodic": [1000, 0.01, 0.5]},
    "tiny": {"pending": [100, 1_000], "ops": 2_000, "periodic": [100, 0.01, 0.1]},
}
FAR = (60.0, 600.0)  # seconds: deadlines never reached during a run
LOOP_PENDING = 1000  # other handles pending in the loop table
HANDLES = 1000  # the handles a table's cases re-arm, in turn


def noop(*args: object) -> None:
    pass


def interleaved(
    cases: dict[str, Callable[[], float]], repeat: int, warm: bool = True
) -> dict[str, list[float]]:
    """Runs every case `repeat` times in a rotating order, after a run of
    each left out if `warm`; each call returns ns per operation.  Returns
    each case's runs."""
    names = list(cases)
    got: dict[str, list[float]] = {k: [] for k in names}
    for k in names if warm else ():
        cases[k]()
    for r in range(repeat):
        for k in names[r % len(names) :] + names[: r % len(names)]:
            got[k].append(cases[k]())
    return got


def far_delays(n: int, seed: int = 1) -> list[float]:
    rng = random.Random(seed)
    return [rng.uniform(*FAR) for _ in range(n)]


# ---- 1. reset against cancel + new_timeout ----


def rearm_cases(
    pending: int, ops: int
) -> tuple[dict[str, Callable[[], float]], Callable[[], None]]:
    import hwtimer

    timer = hwtimer.HashedWheelTimer(0.1, 512)
    background = [timer.new_timeout(noop, d) for d in far_delays(pending)]
    delays = far_delays(ops, seed=2)
    handles = [timer.new_timeout(noop, d) for d in far_delays(HANDLES, seed=3)]

    def reset() -> float:
        hs = handles
        t0 = time.perf_counter_ns()
        for i, d in enumerate(delays):
            hs[i % HANDLES].reset(d)
        return (time.perf_counter_ns() - t0) / len(delays)

    def cancel_new() -> float:
        hs, new = handles, timer.new_timeout
        t0 = time.perf_counter_ns()
        for i, d in enumerate(delays):
            j = i % HANDLES
            hs[j].cancel()
            hs[j] = new(noop, d)
        return (time.perf_counter_ns() - t0) / len(delays)

    def close() -> None:
        background.clear()
        timer.stop()

    return {"reset()": reset, "cancel() + new_timeout()": cancel_new}, close


def child_rearm(pending: int, ops: int, repeat: int) -> dict[str, list[float]]:
    cases, close = rearm_cases(pending, ops)
    try:
        return interleaved(cases, repeat)
    finally:
        close()


# ---- 2. in an asyncio loop ----


def in_loop(
    loop: asyncio.AbstractEventLoop, chunk: Callable[[int], float], ops: int
) -> Callable[[], float]:
    """A case that runs chunk(start) (HANDLES re-arms from `start`,
    returning their ns) inside the running loop, yielding to it between
    chunks, so that asyncio purges its cancelled handles as a live
    service's does."""

    async def timed() -> float:
        total = 0.0
        for start in range(0, ops, HANDLES):
            total += chunk(start)
            await asyncio.sleep(0)
        return total / ops

    return lambda: loop.run_until_complete(timed())


def loop_cases(
    loop: asyncio.AbstractEventLoop, ops: int
) -> tuple[dict[str, Callable[[], float]], Any]:
    import hwtimer

    timer = hwtimer.HashedWheelTimer(0.1, 512)
    delays = far_delays(ops, seed=4)
    keep = [loop.call_later(d, noop) for d in far_delays(LOOP_PENDING, seed=5)]
    keep += [timer.call_later(d, noop, loop=loop) for d in far_delays(LOOP_PENDING, seed=6)]
    hw = [timer.call_later(d, noop, loop=loop) for d in far_delays(HANDLES, seed=7)]
    th = [loop.call_later(d, noop) for d in far_delays(HANDLES, seed=8)]

    def hw_reset(start: int) -> float:
        t0 = time.perf_counter_ns()
        for j, d in enumerate(delays[start : start + HANDLES]):
            hw[j].reset(d)
        return time.perf_counter_ns() - t0

    def handle_replace(start: int) -> float:
        call_later = loop.call_later
        t0 = time.perf_counter_ns()
        for j, d in enumerate(delays[start : start + HANDLES]):
            th[j].cancel()
            th[j] = call_later(d, noop)
        return time.perf_counter_ns() - t0

    cases = {
        "hwtimer call_later + reset()": in_loop(loop, hw_reset, ops),
        "asyncio TimerHandle cancel() + call_later()": in_loop(loop, handle_replace, ops),
    }
    if sys.version_info >= (3, 11):

        async def enter() -> list[asyncio.Timeout]:
            cms = [asyncio.timeout(None) for _ in range(HANDLES)]
            for cm in cms:
                await cm.__aenter__()
            return cms

        # entered in one task; reschedule() does not ask which task calls it
        cms = loop.run_until_complete(enter())

        def scope_reschedule(start: int) -> float:
            now = loop.time()
            t0 = time.perf_counter_ns()
            for j, d in enumerate(delays[start : start + HANDLES]):
                cms[j].reschedule(now + d)
            return time.perf_counter_ns() - t0

        cases["asyncio Timeout.reschedule()"] = in_loop(loop, scope_reschedule, ops)
    return cases, (timer, keep)


def child_loop(ops: int, repeat: int) -> dict[str, list[float]]:
    loop = asyncio.new_event_loop()
    try:
        cases, keep = loop_cases(loop, ops)
        try:
            return interleaved(cases, repeat)
        finally:
            keep[0].stop()
    finally:
        loop.close()


# ---- 3. periodic runs ----


def periodic_run_cost(kind: str, n: int, period: float, seconds: float) -> float:
    """CPU ns per run of `n` tasks repeating every `period` for `seconds`."""
    import hwtimer

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


def child_periodic(n: int, period: float, seconds: float, repeat: int) -> dict[str, list[float]]:
    return interleaved(
        {
            "new_periodic()": lambda: periodic_run_cost("periodic", n, period, seconds),
            "task re-arming itself with new_timeout()": lambda: periodic_run_cost(
                "self", n, period, seconds
            ),
        },
        repeat,
        warm=False,  # each run is a fresh timer, and a second or so long
    )


# ---- the figures ----


def run(cfg: dict) -> dict:
    """The three tables, each measured in a fresh interpreter: summaries of
    ns per re-arm (CPU ns per run for the periodic tasks), and the ratio of
    reset() to the cancel + new_timeout() it replaces, round by round."""
    ops, repeat = cfg["ops"], cfg["repeats"]
    n, period, seconds = cfg["periodic"]
    out: dict[str, Any] = {
        "python": platform.python_version(),
        "repeats": repeat,
        "ops": ops,
        "loop_pending": LOOP_PENDING,
        "periodic": {"tasks": n, "period_s": period, "seconds": seconds},
        "rearm_ns": {},
        "reset_vs_cancel_new": {},
    }
    for pending in cfg["pending"]:
        runs = run_child("rearm", "child_rearm", pending, ops, repeat)
        out["rearm_ns"][str(pending)] = {k: summary(v) for k, v in runs.items()}
        out["reset_vs_cancel_new"][str(pending)] = per_round(
            lambda a, b: a / b, runs["reset()"], runs["cancel() + new_timeout()"]
        )
    runs = run_child("rearm", "child_loop", ops, repeat)
    out["loop_rearm_ns"] = {k: summary(v) for k, v in runs.items()}
    runs = run_child("rearm", "child_periodic", n, period, seconds, repeat)
    out["periodic_cpu_ns_per_run"] = {k: summary(v) for k, v in runs.items()}
    return out


def report(r: dict) -> list[str]:
    lines = [
        f"Python {r['python']}, {r['ops']:,} re-arms a run, median (min-max) of "
        f"{r['repeats']} interleaved repeats"
    ]
    for pending, cases in r["rearm_ns"].items():
        lines.append(f"re-arm with {int(pending):,} pending (ns per re-arm)")
        lines += [f"  {k:45s} {fmt(v):>24}" for k, v in cases.items()]
        lines.append(
            f"  {'reset() / cancel() + new_timeout()':45s} "
            f"{fmt(r['reset_vs_cancel_new'][pending], '.2f'):>24}"
        )
    lines.append(f"re-arm in an asyncio loop, {r['loop_pending']:,} pending (ns per re-arm)")
    lines += [f"  {k:45s} {fmt(v):>24}" for k, v in r["loop_rearm_ns"].items()]
    p = r["periodic"]
    lines.append(
        f"periodic tasks: {p['tasks']:,} every {p['period_s'] * 1e3:g} ms for "
        f"{p['seconds']:g} s (CPU ns per run)"
    )
    lines += [f"  {k:45s} {fmt(v):>24}" for k, v in r["periodic_cpu_ns_per_run"].items()]
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5, help="repeats per figure (median)")
    parser.add_argument("--size", choices=list(SIZES), default="full", help="SIZES' entry")
    parser.add_argument("--pending", type=int, nargs="+", help="table 1's levels (the size's)")
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args(argv)
    if args.repeat < 1:
        parser.error("--repeat must be at least 1: a figure is the median of its repeats")
    if args.pending and min(args.pending) < 0:
        parser.error("--pending takes counts of timeouts, >= 0")
    cfg = dict(SIZES[args.size], repeats=args.repeat)
    if args.pending:
        cfg["pending"] = args.pending
    r = run(cfg)
    print("\n".join(report(r)))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(r, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
