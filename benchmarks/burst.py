"""Burst: many timeouts due in the same tick (500k), callbacks run per
second; against asyncio's loop (its better way is the ratio's base),
uvloop, and the limit: the floor extension's C loop that calls the same
Python function and frees its argument (``floor.c``).  Each implementation
runs in its own process, one after the other, round after round.

Two rates: from the deadline to the last callback (all the work of getting
through the burst, the first callback's lateness included) and from the
first callback to the last (the run rate, what the limit is measured
against).  The first callback's lateness is reported apart.  Each round's
deadline falls at a random point of a tick, as a service's deadlines do:
a tick's timeouts run at its end, so by design up to one tick after their
deadline, half a tick on average.
"""

from __future__ import annotations

import random
import threading
import time

from common import TICK, fmt, new_hwtimer, new_loop, per_round, run_child, summarize

# lead: seconds from the first schedule to the deadline, before the time
# scheduling takes (4 us a timeout, with room to spare)
SIZES = {
    "full": {"n": 500_000, "lead": 0.5},
    "quick": {"n": 100_000, "lead": 0.5},
    "tiny": {"n": 5_000, "lead": 0.05},
}
FIGURE = ">= 10x asyncio's callbacks per second"
IMPLS = (
    "hwtimer",
    "asyncio call_later",
    "asyncio call_at (one deadline)",
    "uvloop call_later",
    "hwtimer call_later (asyncio loop)",
    "floor: C call-and-free loop",
)
FLOOR = "floor: C call-and-free loop"


def counter(n: int, on_done):
    """Returns a callback counting its calls, with one argument (a task of
    new_timeout) or none (a loop callback), and the times of its first and
    n-th calls, filled in as they happen: the clock's, then the process's
    CPU time (all its threads), in ns."""
    times = [0.0, 0.0, 0, 0]
    count = 0
    mono, cpu = time.monotonic, time.process_time_ns

    def tick(timeout=None) -> None:
        nonlocal count
        count += 1
        if count == 1:
            times[0], times[2] = mono(), cpu()
        elif count == n:
            times[1], times[3] = mono(), cpu()
            on_done()

    return tick, times


def burst_result(n: int, times: list, target: float, scheduled_at: float) -> dict:
    """The burst's rate from the deadline to its last callback (all the
    work of getting through it), and, apart, while callbacks ran, by the
    clock and by the process's CPU time (what other processes took of the
    cores left out, what all its own threads spent in)."""
    first, last, cpu_first, cpu_last = times
    return {
        "callbacks_per_s": n / (last - target),
        "callbacks_per_s_first_to_last": (n - 1) / (last - first),
        "cpu_ns_per_callback": (cpu_last - cpu_first) / (n - 1),
        "first_late_ms": (first - target) * 1e3,
        "all_done_after_deadline_ms": (last - target) * 1e3,
        "scheduling_s": scheduled_at,
    }


def child_floor(n: int) -> dict:
    """The limit: the same task, called from C on n fresh objects, each freed
    after its call.  Its 'deadline' is the start of the loop."""
    import floor

    ext = floor.load()
    task, times = counter(n, lambda: None)
    args = ext.make_args(n)
    t0 = time.monotonic()
    elapsed_ns = ext.burst(task, args)
    result = burst_result(n, times, t0, 0.0)
    result["loop_callbacks_per_s"] = n / (elapsed_ns / 1e9)
    return result


def child_hwtimer(n: int, lead: float) -> dict:
    timer = new_hwtimer()
    timer.start()
    done = threading.Event()
    c, times = counter(n, done.set)
    t0 = time.monotonic()
    target = t0 + lead
    new_timeout, mono = timer.new_timeout, time.monotonic
    for _ in range(n):
        new_timeout(c, target - mono())
    scheduled = time.monotonic() - t0
    if not done.wait(lead + 60):
        raise RuntimeError("burst did not finish")
    stats = timer.stats()
    timer.stop()
    result = burst_result(n, times, target, scheduled)
    result["max_expired_per_tick"] = stats["max_expired_per_tick"]
    return result


def child(cfg: dict, impl: str) -> dict:
    n = cfg["n"]
    lead = cfg["lead"] + n * 4e-6 + random.uniform(0, TICK)
    if impl == FLOOR:
        return child_floor(n)
    if impl == "hwtimer":
        return child_hwtimer(n, lead)
    kind = "uvloop" if "uvloop" in impl else "asyncio"
    loop = new_loop(kind)
    fut = loop.create_future()
    c, times = counter(n, lambda: fut.set_result(None))
    if impl.startswith("hwtimer"):
        timer = new_hwtimer()

        def schedule_all(target: float) -> None:
            call_later, mono = timer.call_later, time.monotonic
            for _ in range(n):
                call_later(target - mono(), c, loop=loop)

    elif "call_at" in impl:
        timer = None

        def schedule_all(target: float) -> None:
            # one deadline shared by all: the heap's cheapest case
            call_at = loop.call_at
            for _ in range(n):
                call_at(target, c)

    else:
        timer = None

        def schedule_all(target: float) -> None:
            # as a service would: each with its delay, so their deadlines
            # differ by the time it took to get there
            call_later, now = loop.call_later, loop.time
            for _ in range(n):
                call_later(target - now(), c)

    async def main() -> dict:
        t0 = time.monotonic()
        target = loop.time() + lead
        schedule_all(target)
        scheduled = time.monotonic() - t0
        await fut
        return burst_result(n, times, target, scheduled)

    result = loop.run_until_complete(main())
    if timer is not None:
        timer.stop()
    loop.close()
    return result


def impls() -> tuple:
    """IMPLS, without the floor where it cannot be built."""
    import floor

    return IMPLS if floor.buildable() else IMPLS[:-1]


def run(cfg: dict) -> dict:
    names = impls()
    runs = [{k: run_child("burst", "child", cfg, k) for k in names} for _ in range(cfg["repeats"])]
    out = summarize(runs)

    def series(impl: str, key: str = "callbacks_per_s") -> list[float]:
        return [r[impl][key] for r in runs]

    # asyncio's better way in each round: the base of the ratio
    base = [max(r[k]["callbacks_per_s"] for k in r if k.startswith("asyncio")) for r in runs]
    out["vs_asyncio"] = {
        k: per_round(lambda x, b: x / b, series(k), base) for k in names if k != FLOOR
    }
    if FLOOR in names:
        limit = series(FLOOR, "callbacks_per_s_first_to_last")
        out["vs_floor"] = {
            "hwtimer run rate / limit": per_round(
                lambda x, b: x / b, series("hwtimer", "callbacks_per_s_first_to_last"), limit
            ),
            "hwtimer deadline-to-last rate / limit": per_round(
                lambda x, b: x / b, series("hwtimer"), limit
            ),
            # CPU time per callback, the limit's over hwtimer's: a rate ratio
            "hwtimer run rate / limit, by CPU time": per_round(
                lambda x, b: b / x,
                series("hwtimer", "cpu_ns_per_callback"),
                series(FLOOR, "cpu_ns_per_callback"),
            ),
        }
    out["n"] = cfg["n"]
    return out


def figure(r: dict) -> dict:
    x = r["vs_asyncio"]["hwtimer"]
    return {"value": x, "unit": "x", "met": x["median"] >= 10}


def report(r: dict) -> list[str]:
    lines = [
        f"burst: {r['n']:,} timeouts due in one tick, median (min-max)",
        "callbacks/s from the deadline to the last callback, against asyncio's better way;",
        "first: first callback's lateness; run rate: first callback to last",
        f"{'':<34}{'callbacks/s (M)':>20}{'vs asyncio':>11}{'first ms':>24}{'run rate (M)':>20}",
    ]
    for k, v in r.items():
        if not isinstance(v, dict) or "callbacks_per_s" not in v:
            continue
        rate = {q: x / 1e6 for q, x in v["callbacks_per_s"].items() if q != "runs"}
        run_rate = {
            q: x / 1e6 for q, x in v["callbacks_per_s_first_to_last"].items() if q != "runs"
        }
        vs = r["vs_asyncio"].get(k)
        vs_text = f"{vs['median']:.1f}x" if vs else ""
        lines.append(
            f"{k:<34}{fmt(rate, '.2f'):>20}{vs_text:>11}"
            f"{fmt(v['first_late_ms'], '.1f'):>24}{fmt(run_rate, '.2f'):>20}"
        )
    for k, v in r.get("vs_floor", {}).items():
        lines.append(f"{k}: {fmt(v, '.2f')}x")
    return lines
